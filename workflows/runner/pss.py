"""The `restricted` Pod Security Standard, checked on the pod an Argo template becomes.

Each check is one function following its file in kubernetes/pod-security-admission `policy/`
(the checks behind https://kubernetes.io/docs/concepts/security/pod-security-standards/), and
says what is forbidden in that check's words, so `ckptflow check` prints what the admission
controller of a namespace labelled `pod-security.kubernetes.io/enforce: restricted` would:
`violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false (...)`.

The pod is built as Argo builds it (workflow/controller/workflowpod.go): the template's
`securityContext` (else the workflow's) is the pod's, `hostNetwork` the template's or the
workflow's, volumes those the containers mount. Argo's own init and wait containers are set by
the controller's executor configuration, not the manifest, and are not checked here.
"""

from __future__ import annotations

import yaml

__all__ = ["restricted_violations"]

# policy/check_restrictedVolumes.go: the volume types a restricted pod may use
ALLOWED_VOLUMES = (
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret", "image",
)  # fmt: skip
SECCOMP_OK = ("RuntimeDefault", "Localhost")


def _containers(tmpl: dict) -> list[dict]:
    main = tmpl.get("container") or tmpl.get("script")
    out = [main] if isinstance(main, dict) else []
    out += list((tmpl.get("containerSet") or {}).get("containers") or [])
    out += list(tmpl.get("initContainers") or []) + list(tmpl.get("sidecars") or [])
    return [c for c in out if isinstance(c, dict)]


def _name(c: dict) -> str:
    return str(c.get("name") or "main")


def _sc(c: dict) -> dict:
    sc = c.get("securityContext")
    return sc if isinstance(sc, dict) else {}


def _quoted(names: list[str]) -> str:
    kind = "container" if len(names) == 1 else "containers"
    quoted = ", ".join(f'"{n}"' for n in names)
    return f"{kind} {quoted}"


def host_namespaces(pod: dict, containers: list[dict]) -> str | None:
    """policy/check_hostNamespaces.go (baseline): hostNetwork, hostPID, hostIPC."""
    on = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if pod.get(k) is True]
    return f"host namespaces ({', '.join(on)})" if on else None


def privileged(pod: dict, containers: list[dict]) -> str | None:
    """policy/check_privileged.go (baseline): no container is privileged."""
    bad = [_name(c) for c in containers if _sc(c).get("privileged") is True]
    return (
        f"privileged ({_quoted(bad)} must not set securityContext.privileged=true)" if bad else None
    )


def host_path_volumes(pod: dict, containers: list[dict]) -> str | None:
    """policy/check_hostPathVolumes.go (baseline): no hostPath volume."""
    bad = [str(v.get("name")) for v in pod["volumes"] if "hostPath" in v]
    return f"hostPath volumes ({', '.join(bad)})" if bad else None


def restricted_volumes(pod: dict, containers: list[dict]) -> str | None:
    """policy/check_restrictedVolumes.go: only configMap, csi, downwardAPI, emptyDir, ephemeral,
    persistentVolumeClaim, projected, secret and image volumes (hostPath reported above)."""
    bad = [
        f"{v.get('name')} ({next((k for k in v if k != 'name'), '?')})"
        for v in pod["volumes"]
        if "hostPath" not in v and not any(k in v for k in ALLOWED_VOLUMES)
    ]
    return f"restricted volume types ({', '.join(bad)})" if bad else None


def allow_privilege_escalation(pod: dict, containers: list[dict]) -> str | None:
    """policy/check_allowPrivilegeEscalation.go: every container sets it to false."""
    bad = [_name(c) for c in containers if _sc(c).get("allowPrivilegeEscalation") is not False]
    if not bad:
        return None
    return (
        f"allowPrivilegeEscalation != false ({_quoted(bad)} must set "
        "securityContext.allowPrivilegeEscalation=false)"
    )


def run_as_non_root(pod: dict, containers: list[dict]) -> str | None:
    """policy/check_runAsNonRoot.go: runAsNonRoot true on the pod or on every container, and
    false nowhere."""
    pod_set = _sc(pod).get("runAsNonRoot")
    explicit_false = pod_set is False or any(
        _sc(c).get("runAsNonRoot") is False for c in containers
    )
    unset = [_name(c) for c in containers if _sc(c).get("runAsNonRoot") is None]
    if not explicit_false and (pod_set is True or not unset):
        return None
    return (
        f"runAsNonRoot != true (pod or {_quoted(unset or [_name(c) for c in containers])} "
        "must set securityContext.runAsNonRoot=true)"
    )


def run_as_user(pod: dict, containers: list[dict]) -> str | None:
    """policy/check_runAsUser.go: runAsUser is not 0."""
    if _sc(pod).get("runAsUser") == 0 or any(_sc(c).get("runAsUser") == 0 for c in containers):
        return "runAsUser=0 (pod and containers must not set runAsUser=0)"
    return None


def seccomp_profile(pod: dict, containers: list[dict]) -> str | None:
    """policy/check_seccompProfile_restricted.go: RuntimeDefault or Localhost on the pod or on
    every container; Unconfined nowhere."""
    pod_type = (_sc(pod).get("seccompProfile") or {}).get("type")
    kinds = {_name(c): (_sc(c).get("seccompProfile") or {}).get("type") for c in containers}
    bad = [n for n, t in kinds.items() if t is not None and t not in SECCOMP_OK]
    unset = [n for n, t in kinds.items() if t is None]
    pod_ok = pod_type in SECCOMP_OK
    if pod_type is not None and not pod_ok:
        bad = ["pod", *bad]
    if not bad and (pod_ok or not unset):
        return None
    who = _quoted(bad or unset)
    return f'seccompProfile (pod or {who} must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")'


def capabilities(pod: dict, containers: list[dict]) -> str | None:
    """policy/check_capabilities_restricted.go: every container drops ALL and adds nothing but
    NET_BIND_SERVICE."""
    no_drop, added = [], []
    for c in containers:
        caps = _sc(c).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            no_drop.append(_name(c))
        if any(a != "NET_BIND_SERVICE" for a in caps.get("add") or []):
            added.append(_name(c))
    parts = []
    if no_drop:
        parts.append(f'{_quoted(no_drop)} must set securityContext.capabilities.drop=["ALL"]')
    if added:
        parts.append(
            f'{_quoted(added)} must not include capabilities other than "NET_BIND_SERVICE"'
        )
    return f"unrestricted capabilities ({'; '.join(parts)})" if parts else None


CHECKS = (
    host_namespaces,
    privileged,
    host_path_volumes,
    restricted_volumes,
    allow_privilege_escalation,
    run_as_non_root,
    run_as_user,
    seccomp_profile,
    capabilities,
)


def _pod(tmpl: dict, spec: dict, containers: list[dict]) -> dict:
    """The pod-level fields Argo builds from the template and the workflow (workflowpod.go)."""
    declared = {
        v.get("name"): v
        for v in [*(spec.get("volumes") or []), *(tmpl.get("volumes") or [])]
        if isinstance(v, dict)
    }
    mounted = {
        m.get("name")
        for c in containers
        for m in c.get("volumeMounts") or []
        if isinstance(m, dict)
    }
    volumes = [declared[n] for n in sorted(mounted, key=str) if n in declared]
    volumes += [
        v for n, v in declared.items() if n not in mounted and v in (tmpl.get("volumes") or [])
    ]
    patch = _spec_patch(tmpl.get("podSpecPatch") or spec.get("podSpecPatch"))
    return {
        "securityContext": tmpl.get("securityContext") or spec.get("securityContext") or {},
        "hostNetwork": patch.get("hostNetwork", tmpl.get("hostNetwork", spec.get("hostNetwork"))),
        "hostPID": patch.get("hostPID", tmpl.get("hostPID")),
        "hostIPC": patch.get("hostIPC", tmpl.get("hostIPC")),
        "volumes": volumes,
    }


def _spec_patch(text: object) -> dict:
    """The pod fields a template's podSpecPatch sets (Argo merges it into the pod it built,
    workflow/controller/workflowpod.go); {} when there is none, or it still holds `{{...}}`
    (not judged) or is not a mapping."""
    if not isinstance(text, str) or "{{" in text or len(text) > 1 << 20:
        return {}
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return {}
    return value if isinstance(value, dict) else {}


def restricted_violations(tmpl: dict, spec: dict) -> list[str]:
    """What the `restricted` level forbids in the pod of a container/script/containerSet
    template `tmpl` of a workflow `spec`, each in the admission controller's words; [] if it
    passes (or is not a pod)."""
    containers = _containers(tmpl)
    if not containers:
        return []
    pod = _pod(tmpl, spec, containers)
    return [why for check in CHECKS if (why := check(pod, containers)) is not None]

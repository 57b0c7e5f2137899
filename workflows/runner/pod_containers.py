"""Sidecars and init containers of a template's pod (`--isolate` only).

Argo puts them in the task's pod (workflow/controller/workflowpod.go createWorkflowPod:
`initContainers` before the main container, `sidecars` beside it; `mirrorVolumeMounts` gives
a sidecar the main container's mounts). Kubernetes runs the init containers one after
another to completion first (a failing one fails the pod); Argo ends the sidecars once the
main container ended (workflow/executor/executor.go KillSidecars: SIGTERM, then SIGKILL after
the grace period) and the pod's outcome is the main container's. pods/podinit.py does that
inside the pod; this module checks them before the run and builds what podinit runs.

Differences from a cluster, said here once: there are no images, so each container's command
must be on this machine (checked before the run, as for the main one); every container of the
pod sees all of the pod's volume mounts (the union of theirs), as they share the pod's
filesystem view; sidecar/init stdout goes to the pod's log, never into `outputs.result`.
"""

from __future__ import annotations

import sys
from typing import Any

from ckptflow.workflows.runner.machine import command_problems
from ckptflow.workflows.runner.substitution import to_str

__all__ = ["KINDS", "container_specs", "problems", "volume_mounts"]

KINDS = ("initContainers", "sidecars")
MAX_CONTAINERS = 16  # per kind: a hostile manifest cannot fork without bound
_FIELDS = {"name", "command", "args", "env", "workingDir", "volumeMounts", "mirrorVolumeMounts"}
_IGNORED = {
    "image", "imagePullPolicy", "resources", "securityContext", "livenessProbe", "startupProbe",
    "terminationMessagePath", "terminationMessagePolicy", "ports",
}  # fmt: skip


def problems(key: str, containers: Any, env: dict[str, str]) -> list[tuple[str, str]]:
    """(field, why) for a template's `sidecars` or `initContainers` under --isolate."""
    if not isinstance(containers, list):
        return [(key, "expected a list of containers")]
    if len(containers) > MAX_CONTAINERS:
        return [(key, f"at most {MAX_CONTAINERS} run locally")]
    out: list[tuple[str, str]] = []
    for c in containers:
        name = c.get("name") if isinstance(c, dict) else None
        if not isinstance(name, str) or not name:
            out.append((key, "each container needs a name"))
            continue
        where = f"{key}.{name}"
        for field in c:
            if field not in _FIELDS and field not in _IGNORED:
                why = "not followed for a sidecar locally" if field == "readinessProbe" else (
                    "not supported by the local runner"
                )  # fmt: skip
                out.append((f"{where}.{field}", why))
        if not c.get("command"):
            out.append(
                (
                    f"{where}.command",
                    "missing: the image's entrypoint cannot run locally; give command (and args)",
                )
            )
        out += [(f"{where} {f}", why) for f, why in command_problems(c, env)]
        for e in c.get("env") or []:
            if not isinstance(e, dict) or e.get("valueFrom") is not None:
                name_ = e.get("name") if isinstance(e, dict) else e
                out.append((f"{where}.env.{name_}", "only plain values work in a sidecar"))
    return out


def volume_mounts(body: dict) -> list[dict]:
    """The pod's volume mounts: the main container's, then the other containers' (the first
    of each mountPath; ValueError when two containers mount different volumes there)."""
    main = body.get("container") or body.get("script") or {}
    seen: dict[str, dict] = {}
    for c in [main, *(c for k in KINDS for c in body.get(k) or [])]:
        for m in c.get("volumeMounts") or []:
            path = to_str(m.get("mountPath"))
            had = seen.get(path)
            if had is not None and (had.get("name"), had.get("subPath")) != (
                m.get("name"),
                m.get("subPath"),
            ):
                raise ValueError(f"mountPath {path}: two containers mount different volumes there")
            seen.setdefault(path, m)
    return list(seen.values())


def _argv(c: dict) -> list[str]:
    argv = [to_str(a) for a in [*(c.get("command") or []), *(c.get("args") or [])]]
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable  # as for the main container (leaf._argv)
    return argv


def container_specs(body: dict, env: dict[str, str], cwd: str, grace: float) -> dict:
    """What pods/podinit.py runs besides the main container: `init` and `sidecars`, each
    {name, argv, env, cwd}. `env` is the main container's; its own entries are not theirs
    (each container has its own env), the rest (the runner's environment) is."""
    main = body.get("container") or body.get("script") or {}
    own = {e.get("name") for e in main.get("env") or [] if isinstance(e, dict)}
    base = {k: v for k, v in env.items() if k not in own}
    out: dict[str, Any] = {"grace": grace}
    for key, field in (("initContainers", "init"), ("sidecars", "sidecars")):
        specs = []
        for c in body.get(key) or []:
            c_env = dict(base)
            c_env.update({e["name"]: to_str(e.get("value", "")) for e in c.get("env") or []})
            specs.append(
                {
                    "name": str(c["name"]),
                    "argv": _argv(c),
                    "env": c_env,
                    "cwd": to_str(c.get("workingDir") or cwd),
                }
            )
        if specs:
            out[field] = specs
    return out

"""The checks of a container/script body and of a retryStrategy, for the spec validator
(spec.py `_Checker`, passed in as `chk`: its `err`, `fields`, `machine`, `env`, `objects` and
`refs`): what a local task can run faithfully, each refusal one line naming the field.
"""

from __future__ import annotations

import re
from typing import Any

from ckptflow.workflows.runner.machine import command_problems
from ckptflow.workflows.runner.refs import env_value
from ckptflow.workflows.runner.substitution import to_str

__all__ = ["check_container", "check_retry", "missing_refs"]

_CONTAINER_OK = {"command", "args", "env", "workingDir", "readinessProbe", "ports", "volumeMounts"}
_CONTAINER_IGNORED = {
    "image", "imagePullPolicy", "resources", "securityContext", "name", "livenessProbe",
    "startupProbe", "terminationMessagePath", "terminationMessagePolicy",
}  # fmt: skip
_PROBE_OK = {"tcpSocket", "httpGet", "exec", "initialDelaySeconds", "periodSeconds"}
_PROBE_OK |= {"timeoutSeconds", "failureThreshold", "successThreshold"}
_RETRY_OK = {"limit", "retryPolicy", "backoff", "affinity", "expression"}  # expr.py
_POLICIES = ("Always", "OnFailure", "OnError", "OnTransientError")
_FIELD_REFS = ("status.podIP", "metadata.name", "metadata.namespace", "spec.nodeName")
_FIELD_KEY = re.compile(r"""^metadata\.(labels|annotations)\[(['"]).+\2\]$""")


def check_retry(chk, where: str, rs: Any) -> None:
    """A retryStrategy (workflow_types.go RetryStrategy): its fields, a whole-number limit,
    a known retryPolicy, the backoff fields (`chk`: spec.py's checker)."""
    if not isinstance(rs, dict):
        chk.err(where, "retryStrategy", "expected a mapping")
        return
    chk.fields(f"{where} retryStrategy", rs, _RETRY_OK, set())
    limit = rs.get("limit")
    if limit is not None and not to_str(limit).isdigit() and "{{" not in to_str(limit):
        chk.err(where, "retryStrategy.limit", f"{limit!r} is not a whole number")
    policy = rs.get("retryPolicy")
    if policy is not None and policy not in _POLICIES:
        chk.err(where, "retryStrategy.retryPolicy", f"{policy!r} is not one of {_POLICIES}")
    backoff = rs.get("backoff") or {}
    for key in backoff:
        if key not in ("duration", "factor", "maxDuration", "cap"):
            chk.err(where, f"retryStrategy.backoff.{key}", "not supported")


def check_container(chk, where: str, c: Any, *, script: bool) -> None:
    """A container/script body: its fields, a command (there is no image entrypoint), what
    this machine lacks (machine.py), env valueFrom (fieldRef paths the downward API gives;
    secretKeyRef/configMapKeyRef noted in `chk.refs` when neither the store nor the
    environment has them) and the readinessProbe (`chk`: spec.py's checker)."""
    if not isinstance(c, dict):
        chk.err(where, "container", "expected a mapping")
        return
    chk.fields(where, c, _CONTAINER_OK | ({"source"} if script else set()), _CONTAINER_IGNORED)
    if not c.get("command"):
        chk.err(
            where,
            "command",
            "missing: the image's entrypoint cannot run locally; give command (and args)",
        )
    chk.machine(where, command_problems(c, chk.env))
    for e in c.get("env") or []:
        name = e.get("name")
        vf = e.get("valueFrom")
        if vf is None:
            continue
        if "fieldRef" in vf:
            path = (vf["fieldRef"] or {}).get("fieldPath")
            if path not in _FIELD_REFS and not _FIELD_KEY.match(str(path)):
                chk.err(
                    where,
                    f"env.{name}.valueFrom.fieldRef",
                    f"only {_FIELD_REFS} and metadata.labels/annotations['KEY'] work",
                )
        elif "secretKeyRef" in vf or "configMapKeyRef" in vf:
            stored = chk.objects is not None and env_value(chk.objects, vf) is not None
            if name not in chk.env and not stored:
                kind = "secretKeyRef" if "secretKeyRef" in vf else "configMapKeyRef"
                ref = str((vf[kind] or {}).get("name"))
                chk.refs.setdefault((kind, ref), {}).setdefault(name, set()).add(where)
        else:
            chk.err(where, f"env.{name}.valueFrom", "not supported locally")
    probe = c.get("readinessProbe")
    if probe is not None:
        chk.fields(f"{where} readinessProbe", probe, _PROBE_OK)
        if not any(k in probe for k in ("tcpSocket", "httpGet", "exec")):
            chk.err(where, "readinessProbe", "needs tcpSocket, httpGet or exec")


def missing_refs(refs: dict) -> list[tuple[str, str, str]]:
    """One line per Secret or ConfigMap the runner cannot read, naming the variables to
    export and how many templates use it (the cluster manifest, run locally, said the same
    thing once per template and variable: 14 lines for one Secret); (where, field, why) each.
    `refs`: (kind, object name) -> {variable: templates}, collected by check_container."""
    out = []
    for (kind, ref), used in sorted(refs.items()):
        names = sorted(used)
        places = len(set().union(*used.values()))
        out.append(
            (
                f"{kind[:-6][0].upper()}{kind[1:-6]} {ref!r}",
                ", ".join(f"env.{n}.valueFrom.{kind}" for n in names)
                + f" in {places} template{'s' if places > 1 else ''}",
                f"the {kind[:-6]} is not in the cluster model: give it with --objects FILE, or "
                f"export {' '.join(names)} in the environment of the runner (passed through)",
            )
        )
    return out

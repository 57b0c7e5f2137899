"""Suspend templates with a `duration`: the node waits that long, then Succeeds.

Argo (workflow/controller/operator.go executeSuspend): a Suspend node is Running until
`startedAt + duration`, then Succeeded, its output parameters taking their `valueFrom.default`
(util.OverrideOutputParametersWithDefault). The duration is a number of seconds or a Go
duration (v1alpha1 ParseStringToDuration). A suspend template without a duration waits for
`argo resume`, which has no local counterpart: spec.py refuses it before anything runs.
"""

from __future__ import annotations

import time

from ckptflow.workflows.runner import context as cx
from ckptflow.workflows.runner.nodes import ERROR, FAILED, RUNNING, SUCCEEDED, Node
from ckptflow.workflows.runner.substitution import parse_duration, substitute, to_str

__all__ = ["MAX_SUSPEND_S", "run_suspend", "suspend_problems"]

MAX_SUSPEND_S = 7 * 24 * 3600.0  # a bound: a typo of "20000000" is not a run that never ends


def suspend_problems(tmpl: dict) -> list[tuple[str, str]]:
    """(field, why) for a suspend template the runner cannot run as Argo would."""
    block = tmpl.get("suspend")
    if not isinstance(block, dict):
        return [("suspend", "expected a mapping (suspend: {duration: ...})")]
    out = [(f"suspend.{k}", "not a suspend field (duration)") for k in block if k != "duration"]
    duration = block.get("duration")
    if duration in (None, ""):
        return out + [("suspend", "a suspend template without a duration waits for `argo resume`")]
    if "{{" not in to_str(duration):
        try:
            seconds = parse_duration(duration)
        except ValueError as exc:
            return out + [("suspend.duration", str(exc))]
        if not 0 <= seconds <= MAX_SUSPEND_S:
            out.append(("suspend.duration", f"{duration!r} is not within 0..{MAX_SUSPEND_S:.0f}s"))
    return out


def _default_outputs(body: dict) -> dict | None:
    params = []
    for p in (body.get("outputs") or {}).get("parameters") or []:
        vf = p.get("valueFrom") or {}
        value = vf.get("default", p.get("value"))
        if value is not None:
            params.append({"name": p["name"], "value": to_str(value)})
    return {"parameters": params} if params else None


def run_suspend(
    run: cx.Run, node: Node, tmpl: dict, values: dict[str, str], scope: cx.Scope, on_daemon
) -> None:
    """One suspend node (the Kind `run` of suspend templates): wait, then Succeed; a scope
    that ends first (a deadline, Ctrl-C) fails it with the scope's reason."""
    body = substitute(tmpl, values)
    try:
        seconds = parse_duration(body["suspend"]["duration"])
    except ValueError as exc:
        run.store.update(node, phase=ERROR, message=f"suspend.duration: {exc}")
        return
    run.store.update(node, phase=RUNNING)
    end = time.monotonic() + min(max(seconds, 0.0), MAX_SUSPEND_S)
    while (left := end - time.monotonic()) > 0:
        reason = scope.reason()
        if reason is not None:
            run.store.update(node, phase=FAILED, message=reason[1])
            return
        time.sleep(min(0.1, left))
    run.store.update(node, phase=SUCCEEDED, outputs=_default_outputs(body))

"""Run a `steps` template: groups one after another, the steps of a group in parallel.

A group succeeds when none of its steps (or loop items) failed or errored without
`continueOn`; the first group that fails ends the template with that phase. Daemoned steps
keep running until the template ends.

With the template's `failFast`, once a child failed or errored no further child starts, and
the group and template fail with Argo's message (workflow/controller/operator.go
checkParallelism: `tmpl.IsFailFast() && getUnsuccessfulChildren > 0`): with `parallelism: 1`
the items after a failed one never run.
"""

from __future__ import annotations

from ckptflow.workflows.runner import children as ch
from ckptflow.workflows.runner import context as cx
from ckptflow.workflows.runner import hooks
from ckptflow.workflows.runner.nodes import ERROR, FAILED, RUNNING, SUCCEEDED, Node

__all__ = ["FAIL_FAST", "run_steps"]

FAIL_FAST = "template has failed or errored children and failFast enabled"  # operator.go


def _continues(step: dict, phase: str) -> bool:
    cont = step.get("continueOn") or {}
    return (phase == FAILED and bool(cont.get("failed"))) or (
        phase == ERROR and bool(cont.get("error"))
    )


def _run_group(run, node, index, group, local, parents, scope, parallelism, fail_fast=False):
    """Start one group and wait for it; return (group node, [(step, nodes, looped)], whether
    failFast kept children from starting)."""
    store = run.store
    gnode = store.create(
        f"{node.name}[{index}]", f"[{index}]", "StepGroup", template_name=node.template_name,
        boundary_id=node.id, parents=parents, phase=RUNNING,
    )  # fmt: skip
    launcher = ch.Launcher(parallelism)
    results: list[tuple[dict, list[Node], bool]] = []
    values = run.global_vars()
    values.update(ch.input_vars(node))  # scope.go createScope: the template's inputs
    values.update(local)
    for step in group:
        name = f"{gnode.name}.{step['name']}"
        values["steps.name"] = step["name"]  # the step being planned, as Argo names it
        kids: list[Node] = []
        try:
            units, loop = ch.plan(step, values, name, step["name"])
        except ValueError as exc:
            err = store.create(
                name, step["name"], "Skipped", template_name=step.get("template"),
                boundary_id=node.id, parents=[gnode], phase=ERROR, message=str(exc),
            )  # fmt: skip
            results.append((step, [err], False))
            continue
        if loop and not units:
            skipped = store.create(
                name, step["name"], "Skipped", template_name=step.get("template"),
                boundary_id=node.id, parents=[gnode], phase="Skipped", message="Skipped, empty params",
            )  # fmt: skip
            results.append((step, [skipped], False))
            continue
        for unit in units:
            launcher.add(
                lambda u=unit, k=kids: (
                    k.append(ch.start_unit(run, u, node.id, [gnode], scope)) or k[-1]
                )
            )
        results.append((step, kids, bool(loop)))
    stopped = False
    while True:
        gen = store.generation
        if scope.reason() is not None:
            launcher.drop_pending()
        if fail_fast and any(n.phase in (FAILED, ERROR) for n in launcher.started):
            stopped = launcher.drop_pending() > 0 or stopped
        launcher.pump()
        # steps.go executeStepGroup: a group completes once its steps' hooks and exit handlers
        # have finished too (hooks.py)
        if not launcher.busy() and hooks.settled(run, launcher.started):
            break
        store.wait_change(gen, 0.1)
    return gnode, results, stopped


def run_steps(run: cx.Run, node: Node, body: dict, scope: cx.Scope) -> tuple[str, str, dict]:
    """Run a steps template as `node`; return (phase, message, its `steps.*` variables)."""
    inner = scope.child()
    local: dict[str, str] = {}
    parents: list[Node] = [node]
    phase, message = SUCCEEDED, ""
    started: list[Node] = []
    try:
        for index, group in enumerate(body.get("steps") or []):
            group = group if isinstance(group, list) else [group]
            gnode, results, stopped = _run_group(
                run, node, index, group, local, parents, inner, body.get("parallelism"),
                bool(body.get("failFast")),
            )  # fmt: skip
            group_phase, group_msg = SUCCEEDED, ""
            for step, kids, looped in results:
                started.extend(kids)
                for kid in kids:
                    if kid.phase in (FAILED, ERROR) and not _continues(step, kid.phase):
                        group_phase = group_phase if group_phase != SUCCEEDED else kid.phase
                        group_msg = group_msg or f"child '{kid.id}' {kid.phase.lower()}"
                if looped:
                    local.update(cx.aggregate_vars(f"steps.{step['name']}", None, kids))
                elif kids:
                    local.update(cx.node_vars(f"steps.{step['name']}", kids[0]))
            if stopped:
                group_phase, group_msg = FAILED, FAIL_FAST
            if scope.reason() is not None and scope.reason()[0] != cx.SCOPE_END:
                group_phase, group_msg = FAILED, scope.reason()[1]
            run.store.update(gnode, phase=group_phase, message=group_msg)
            if group_phase != SUCCEEDED:
                phase, message = group_phase, group_msg
                break
            parents = [k for _, kids, _ in results for k in kids] or [gnode]
    finally:
        inner.cancel(cx.SCOPE_END, "stopped: its steps template ended")
        launcher = ch.Launcher(None)
        launcher.started = started
        launcher.wait_all_done(run)
    return phase, message, local

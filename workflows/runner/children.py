"""What DAG and steps templates share: resolve a step/task, expand its loop, honour `when`,
and start its children within the template's `parallelism`.

Children start through `run.dispatch.start` (execute.start, handed down by workflow.py): importing
execute would be a cycle, since execute runs the DAG/steps templates that use this module.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from ckptflow.workflows.runner import context as cx
from ckptflow.workflows.runner import hooks
from ckptflow.workflows.runner.nodes import ERROR, SKIPPED, Node
from ckptflow.workflows.runner.substitution import (
    expand_items,
    explain,
    item_label,
    item_vars,
    per_item,
    substitute,
    substitute_item,
    to_str,
    unresolved,
)
from ckptflow.workflows.runner.when import WhenError, evaluate_when

__all__ = ["Launcher", "Unit", "plan"]

_LOOPS = ("withItems", "withParam", "withSequence")


# resolved when they run (hooks.py), with the step's own outputs: steps.go resolveReferences
# and dag.go resolveDependencyReferences leave a step's Hooks out of its substitution
_LATER = ("hooks", "onExit")


class Unit:
    """One child to start: a step/task or one item of it, fully substituted but its hooks
    (`later`: item values only), and `values`, the scope it was planned in."""

    def __init__(
        self, spec: dict, name: str, display: str, later: dict | None = None,
        values: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        self.spec, self.name, self.display = spec, name, display
        self.later, self.values = later or {}, values or {}


def input_vars(node: Node) -> dict[str, str]:
    """`inputs.parameters.X` of a DAG/steps node: in its children's scope as in Argo's
    (workflow/controller/scope.go createScope), so `{{=asInt(item) * asInt(inputs.parameters.n)}}`
    sees both when each loop item is filled in (steps.go processItem)."""
    return {f"inputs.parameters.{p['name']}": to_str(p.get("value")) for p in node.inputs or []}


def _check(spec: dict, what: str, values: dict[str, str]) -> None:
    missing = [t for t in unresolved(spec) if not per_item(t)]
    if missing:  # explain: an expression's error
        raise ValueError(f"{what}: failed to resolve {explain(missing[0], values)}")


def plan(
    spec: dict, values: dict[str, str], name: str, display: str
) -> tuple[list[Unit] | None, str]:
    """Substitute a step/task; return its units (None = no loop: one unit) and the base name.

    Raises ValueError for unresolvable references or a bad loop value.
    """
    later = {k: spec[k] for k in _LATER if k in spec}
    body = substitute({k: v for k, v in spec.items() if k not in _LATER}, values)
    _check(body, f"step/task {spec['name']!r}", values)
    items = expand_items(body)
    if items is None:
        for tag in unresolved(body):
            raise ValueError(
                f"step/task {spec['name']!r}: failed to resolve {explain(tag, values)}"
            )
        return [Unit(body, name, display, later, values)], ""
    base = {k: v for k, v in body.items() if k not in _LOOPS}
    units = []
    for i, item in enumerate(items):
        one = substitute_item(base, item, values)
        left = unresolved(one)
        if left:
            why = explain(left[0], {**values, **item_vars(item)})
            raise ValueError(f"step/task {spec['name']!r}: failed to resolve {why}")
        label = item_label(spec["name"], i, item)
        prefix = name[: len(name) - len(spec["name"])]
        item_later = substitute(later, item_vars(item))
        units.append(Unit(one, prefix + label, label, item_later, values))
    return units, "loop"


def start_unit(
    run: cx.Run, unit: Unit, boundary_id: str, parents: list[Node], scope: cx.Scope
) -> Node:
    """Start one unit, or record it as Skipped (`when` false) or Error (bad `when`)."""
    when = unit.spec.get("when")
    template = unit.spec["template"]
    try:
        go = evaluate_when(to_str(when)) if when is not None else True
    except WhenError as exc:
        return run.store.create(
            unit.name, unit.display, "Skipped", template_name=template, boundary_id=boundary_id,
            parents=parents, phase=ERROR, message=str(exc),
        )  # fmt: skip
    if not go:
        skipped = run.store.create(
            unit.name, unit.display, "Skipped", template_name=template, boundary_id=boundary_id,
            parents=parents, phase=SKIPPED, message=f"when '{when}' evaluated false",
        )  # fmt: skip
        if unit.later and _in_dag(run, boundary_id):  # dag.go: a skipped task's named hooks
            named = hooks.split_for_group(unit.later)[0]  # (steps.go skips a step's)
            hooks.watch_step(
                run, skipped, named, unit.values, _ref(run, unit, boundary_id), boundary_id, scope
            )
        return skipped
    args = {
        p["name"]: to_str(p.get("value", ""))
        for p in (unit.spec.get("arguments") or {}).get("parameters") or []
    }
    node = run.dispatch.start(
        run,
        name=unit.name,
        display=unit.display,
        template=template,
        args=args,
        artifacts=(unit.spec.get("arguments") or {}).get("artifacts") or [],
        boundary_id=boundary_id,
        parents=parents,
        scope=scope,
    )
    if unit.later:
        _watch_hooks(run, unit, node, boundary_id, scope)
    return node


def _in_dag(run: cx.Run, boundary_id: str) -> bool:
    boundary = run.store.nodes.get(boundary_id)
    return boundary is not None and boundary.type == "DAG"


def _ref(run: cx.Run, unit: Unit, boundary_id: str) -> str:
    """Where a step's status and outputs are in its hooks' scope: `steps.<expanded step name>`
    (steps.go) or `tasks.<task name>` (dag.go: the task's own name, items too)."""
    if _in_dag(run, boundary_id):
        return f"tasks.{unit.spec['name']}"
    return f"steps.{unit.display}"


def _watch_hooks(run: cx.Run, unit: Unit, node: Node, boundary_id: str, scope: cx.Scope) -> None:
    """Hand a started step/task with hooks to hooks.py."""
    ref = _ref(run, unit, boundary_id)
    hooks.watch_step(run, node, unit.later, unit.values, ref, boundary_id, scope)


class Launcher:
    """Starts children of one template, at most `parallelism` unfulfilled at a time."""

    def __init__(self, parallelism: int | None) -> None:
        self.limit = parallelism
        self.pending: deque[Callable[[], Node]] = deque()
        self.started: list[Node] = []

    def add(self, start: Callable[[], Node]) -> None:
        self.pending.append(start)

    def running(self) -> int:
        return sum(1 for n in self.started if not n.fulfilled)

    def pump(self) -> None:
        while self.pending and (self.limit is None or self.running() < self.limit):
            self.started.append(self.pending.popleft()())

    def drop_pending(self) -> int:
        dropped = len(self.pending)
        self.pending.clear()
        return dropped

    def busy(self) -> bool:
        return bool(self.pending) or self.running() > 0

    def wait_all_done(self, run: cx.Run, timeout: float = 30.0) -> None:
        """After the scope ended: wait until stopped daemons have really finished."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            gen = run.store.generation
            if all(
                n.phase in ("Succeeded", "Failed", "Error", "Skipped", "Omitted")
                for n in self.started
            ):
                return
            run.store.wait_change(gen, 0.05)

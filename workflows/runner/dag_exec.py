"""Run a `dag` template: enhanced depends, targets, failFast, fan-out task groups, daemons.

Scheduling follows Argo's controller: a task whose dependencies are all fulfilled either runs
(depends true) or is Omitted (depends false); the DAG's phase comes from its target tasks, an
omitted or skipped task inheriting the phase of the branch that led to it. With failFast (the
default), an unhandled failure (no continueOn, no dependent asking for `.Failed`/`.Errored`)
stops new tasks from starting; running ones finish, then the DAG fails.
"""

from __future__ import annotations

from ckptflow.workflows.runner import children as ch
from ckptflow.workflows.runner import context as cx
from ckptflow.workflows.runner import depends as dep
from ckptflow.workflows.runner import hooks
from ckptflow.workflows.runner.nodes import (
    ERROR,
    FAILED,
    OMITTED,
    RUNNING,
    SKIPPED,
    SUCCEEDED,
    Node,
)

__all__ = ["run_dag"]

_BAD = (FAILED, ERROR)


class _Dag:
    def __init__(self, run: cx.Run, node: Node, body: dict, scope: cx.Scope) -> None:
        self.run, self.node, self.scope = run, node, scope
        dag = body["dag"]
        self.tasks = {t["name"]: t for t in dag["tasks"]}
        self.trees = {
            n: dep.parse_depends(str(t["depends"]))
            if t.get("depends")
            else dep.from_dependencies(t.get("dependencies") or [])
            for n, t in self.tasks.items()
        }
        self.deps = {n: dep.tasks_in(tree) for n, tree in self.trees.items()}
        used = set().union(*self.deps.values()) if self.deps else set()
        self.targets = str(dag.get("target") or "").split() or [
            n for n in self.tasks if n not in used
        ]
        self.needed = self._closure(self.targets)
        self.handled = set().union(*(dep.failure_handlers(t) for t in self.trees.values()))
        self.fail_fast = dag.get("failFast", True) is not False
        self.inner = scope.child()  # ends when the DAG ends: stops its daemons
        self.launcher = ch.Launcher(body.get("parallelism"))
        self.state: dict[str, Node] = {}  # task -> its node (TaskGroup for loops)
        self.items: dict[str, list[Node]] = {}
        self.expected: dict[str, int] = {}
        self.stopped: tuple[str, str] | None = None

    def _closure(self, names: list[str]) -> list[str]:
        seen: list[str] = []

        def visit(n: str) -> None:
            if n in seen:
                return
            for d in sorted(self.deps[n]):
                visit(d)
            seen.append(n)

        for n in names:
            visit(n)
        return seen

    def ancestors(self, name: str) -> list[str]:
        return [n for n in self._closure([name]) if n != name]

    def fulfilled(self, name: str) -> bool:
        """Done for its dependents: its hooks and exit handler finished too (dag.go
        evaluateDependsLogic: common.CheckAllHooksFullfilled; hooks.py)."""
        n = self.state.get(name)
        if n is None:
            return False
        if n.type == "TaskGroup":
            done = n.phase in (SUCCEEDED, FAILED, ERROR, SKIPPED, OMITTED)
            return done and hooks.settled(self.run, [n, *self.items.get(name, [])])
        return n.fulfilled and hooks.settled(self.run, [n])

    def facts(self, name: str) -> dep.TaskFacts:
        n = self.state[name]
        kids = self.items.get(name, [])
        return dep.TaskFacts(
            phase=n.phase,
            daemoned=n.daemoned,
            any_succeeded=any(k.phase == SUCCEEDED for k in kids),
            all_failed=bool(kids) and all(k.phase == FAILED for k in kids),
        )

    def local_vars(self, names: list[str]) -> dict[str, str]:
        values: dict[str, str] = {}
        for a in names:
            n = self.state.get(a)
            if n is None:
                continue
            if n.type == "TaskGroup" or a in self.items:
                values.update(cx.aggregate_vars(f"tasks.{a}", n, self.items.get(a, [])))
            else:
                values.update(cx.node_vars(f"tasks.{a}", n))
        return values

    def omitted(self, name: str) -> bool:
        """Record `name` as Omitted (and say so) when its depends is false."""
        tree = self.trees[name]
        if tree is None:
            return False
        facts = {d: self.facts(d) for d in self.deps[name]}
        cont = {d: self.tasks[d].get("continueOn") or {} for d in self.deps[name]}
        if dep.evaluate(tree, facts, cont):
            return False
        parents = [self.state[d] for d in sorted(self.deps[name])]
        self.state[name] = self.run.store.create(
            f"{self.node.name}.{name}", name, "Skipped", template_name=self.tasks[name].get("template"),
            boundary_id=self.node.id, parents=parents, phase=OMITTED,
            message="omitted: depends condition not met",
        )  # fmt: skip
        named, _ = hooks.split_for_group(self.tasks[name])  # dag.go: an omitted task's hooks
        if named:
            values = {**self.run.global_vars(), **self.local_vars(self.ancestors(name))}
            hooks.watch_step(
                self.run, self.state[name], named, values, f"tasks.{name}", self.node.id,
                self.inner,
            )  # fmt: skip
        return True

    def schedule(self, name: str) -> None:
        if self.omitted(name):
            return
        task, store = self.tasks[name], self.run.store
        parents = [self.state[d] for d in sorted(self.deps[name])] or [self.node]
        node_name = f"{self.node.name}.{name}"
        common = {
            "template_name": task.get("template"),
            "boundary_id": self.node.id,
            "parents": parents,
        }
        values = self.run.global_vars()
        values.update(ch.input_vars(self.node))  # scope.go createScope: the template's inputs
        values.update(self.local_vars(self.ancestors(name)))
        values["tasks.name"] = name  # the task being planned, as Argo names it
        try:
            units, loop = ch.plan(task, values, node_name, name)
        except ValueError as exc:
            self.state[name] = store.create(
                node_name, name, "Skipped", phase=ERROR, message=str(exc), **common
            )
            return
        if not loop:
            unit = units[0]
            start = lambda: ch.start_unit(self.run, unit, self.node.id, parents, self.inner)  # noqa: E731
            self.launcher.add(lambda: self._remember(name, start()))
            self.state[name] = _Placeholder(name)  # type: ignore[assignment]
            return
        if not units:
            msg = "Skipped, empty params"
            self.state[name] = store.create(
                node_name, name, "Skipped", phase=SKIPPED, message=msg, **common
            )
            return
        group = store.create(node_name, name, "TaskGroup", phase=RUNNING, **common)
        self.state[name], self.items[name], self.expected[name] = group, [], len(units)
        # dag.go: the task's named hooks on its TaskGroup node, its exit hook on each item
        named, _ = hooks.split_for_group(task)
        hooks.watch_step(self.run, group, named, values, f"tasks.{name}", self.node.id, self.inner)
        for unit in units:
            unit.later = hooks.split_for_group(unit.later)[1]
        for unit in units:
            self.launcher.add(
                lambda u=unit: self._add_item(
                    name, ch.start_unit(self.run, u, self.node.id, [group], self.inner)
                )
            )

    def _remember(self, name: str, node: Node) -> Node:
        self.state[name] = node
        return node

    def _add_item(self, name: str, node: Node) -> Node:
        self.items[name].append(node)
        return node

    def settle_groups(self) -> None:
        for name, kids in self.items.items():
            group = self.state[name]
            if group.phase != RUNNING:
                continue
            cut = self.stopped is not None or self.scope.reason() is not None
            # dag.go: a group ends once its items' exit handlers have ended too (hooks.py)
            ended = all(k.fulfilled for k in kids) and hooks.settled(self.run, kids)
            if (len(kids) == self.expected[name] or cut) and ended:
                bad = [k.phase for k in kids if k.phase in _BAD]
                if len(kids) < self.expected[name] and not bad:
                    bad = [FAILED]  # items that never started because the DAG was cut short
                self.run.store.update(group, phase=bad[0] if bad else SUCCEEDED)

    def check_fail_fast(self) -> None:
        if self.stopped is not None or not self.fail_fast:
            return
        for name, n in self.state.items():
            if isinstance(n, _Placeholder) or n.phase not in _BAD:
                continue
            cont = self.tasks[name].get("continueOn") or {}
            if (n.phase == FAILED and cont.get("failed")) or (
                n.phase == ERROR and cont.get("error")
            ):
                continue
            if name in self.handled:
                continue
            self.stopped = (n.phase, f"child '{n.id}' {n.phase.lower()}")
            self.drop_pending()
            return

    def drop_pending(self) -> None:
        """Forget queued children (failFast, deadline, Ctrl-C): they never start."""
        self.launcher.drop_pending()
        for name in [n for n, v in self.state.items() if isinstance(v, _Placeholder)]:
            del self.state[name]

    def ready(self, name: str) -> bool:
        return name not in self.state and all(self.fulfilled(d) for d in self.deps[name])

    def loop(self) -> None:
        store = self.run.store
        while True:
            gen = store.generation
            if self.stopped is None and self.scope.reason() is None:
                for name in self.needed:
                    if self.ready(name):
                        self.schedule(name)
                self.launcher.pump()
            else:
                self.drop_pending()
                for name in self.needed:  # Argo still omits tasks whose depends became false
                    if self.ready(name):
                        self.omitted(name)
            self.settle_groups()
            self.check_fail_fast()
            if not self.launcher.busy() and self._finished():
                return
            store.wait_change(gen, 0.1)

    def _finished(self) -> bool:
        """Nothing unfinished, and nothing left to start (or no more starting)."""
        unfinished = [n for n in self.state.values() if not n.fulfilled and n.type != "TaskGroup"]
        if unfinished:
            return False
        started = [n for n in self.state.values() if not isinstance(n, _Placeholder)]
        if not hooks.settled(self.run, started + [k for ks in self.items.values() for k in ks]):
            return False  # dag.go: the DAG waits for its tasks' exit handlers and hooks
        cut = self.stopped is not None or self.scope.reason() is not None
        return cut or not any(self.ready(n) for n in self.needed)

    def branch_phases(self) -> dict[str, str]:
        """Each task's branch phase: its own if it completed, else the worst of its parents'."""
        phases: dict[str, str] = {}
        for name in self.needed:
            n = self.state.get(name)
            inherited = [phases[d] for d in self.deps[name] if d in phases]
            worst = next((p for p in (ERROR, FAILED) if p in inherited), SUCCEEDED)
            if n is None:
                continue
            phases[name] = n.phase if n.phase in (SUCCEEDED, FAILED, ERROR) else worst
        return phases

    def phase(self) -> tuple[str, str]:
        reason = self.scope.reason()
        if reason is not None and reason[0] != cx.SCOPE_END:
            return FAILED, reason[1]
        if self.stopped is not None:
            return self.stopped
        phases = self.branch_phases()
        for target in self.targets:
            p = phases.get(target)
            if p is None:
                return (FAILED, reason[1]) if reason else (ERROR, f"target {target!r} never ran")
            if p in _BAD:
                cont = self.tasks[target].get("continueOn") or {}
                if (p == FAILED and cont.get("failed")) or (p == ERROR and cont.get("error")):
                    continue
                return p, reason[1] if reason else f"child '{self.state[target].id}' {p.lower()}"
        return SUCCEEDED, ""


class _Placeholder:
    """Stands for a task queued behind the template's parallelism (not yet a node)."""

    def __init__(self, name: str) -> None:
        self.name, self.phase, self.type, self.daemoned = name, "Pending", "Queued", False
        self.fulfilled = False


def run_dag(run: cx.Run, node: Node, body: dict, scope: cx.Scope) -> tuple[str, str, dict]:
    """Run a DAG template as `node`; return (phase, message, the DAG's `tasks.*` variables)."""
    names = {t["name"] for t in body["dag"]["tasks"]}
    # a target from {{inputs.parameters.x}} is known only now (validate checked literal ones)
    for target in str(body["dag"].get("target") or "").split():
        if target not in names:
            return ERROR, f"dag.target: unknown task {target!r}", {}
    d = _Dag(run, node, body, scope)
    try:
        d.loop()
    finally:
        d.inner.cancel(cx.SCOPE_END, "stopped: its DAG ended")
        d.launcher.wait_all_done(run)
    phase, message = d.phase()
    return phase, message, d.local_vars(list(d.state))

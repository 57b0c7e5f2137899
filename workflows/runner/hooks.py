"""Argo's lifecycle hooks and exit handlers: the workflow's `spec.hooks` (`exit`, and named hooks
with an `expression`), and those of a step or DAG task (`hooks:` or `onExit:`).

Each rule follows argoproj/argo-workflows (v4.1.2) workflow/controller:
- a named hook starts its template once, the first time its expression is true, as the node
  `<parent>.hooks.<name>`; the parent waits for every hook it started (hooks.go
  executeWfLifeCycleHook / executeTmplLifeCycleHook; steps.go executeStepGroup; dag.go
  executeDAGTask and evaluateDependsLogic via common.CheckAllHooksFullfilled);
- the `exit` hook (or `onExit: TEMPLATE`) starts once its step/task completed (Succeeded, Failed or
  Error: not Skipped, Omitted or still daemoned), after the named hooks it started finished, as
  `<parent>.onExit`, with the step's own outputs in `{{steps.NAME.outputs...}}` /
  `{{tasks.NAME.outputs...}}` (exit_handler.go runOnExitNode, resolveExitTmplArgument); without
  arguments of its own it gets the workflow's (workflow_types.go GetExitHook, WithArgs); it still
  runs past the workflow's deadline (operator.go executeTemplate `opts.onExitTemplate`);
- no hook changes the phase of its step, task, group or DAG (steps.go / dag.go assess only the
  steps and tasks themselves); only the workflow's exit handler failing turns a Succeeded
  workflow Failed or Error, with that node's message (operator.go); an expression that cannot be
  evaluated makes the step/task Error (steps.go / dag.go markNodeError), the workflow's makes
  the workflow Error.

Templates start through `run.dispatch.start` (execute.start), never imported from here.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ckptflow.workflows.runner import context as cx
from ckptflow.workflows.runner import expr
from ckptflow.workflows.runner.nodes import DONE, ERROR, FAILED, RUNNING, SUCCEEDED, Node
from ckptflow.workflows.runner.substitution import substitute, to_str

__all__ = [
    "EXIT",
    "ExitScope",
    "exit_hook",
    "problems",
    "settled",
    "watch_step",
    "WorkflowHooks",
    "workflow_status",
]

EXIT = "exit"  # wfv1.ExitLifecycleEvent
MAX_HOOKS = 64  # hooks of one workflow, step or task: a hostile manifest cannot start thousands
_HOOK_FIELDS = {"template", "arguments", "expression", "templateRef"}


def exit_hook(holder: dict, default_args: dict | None) -> dict | None:
    """The exit hook of a workflow spec or a step/task, or None: `onExit: NAME` first, else
    `hooks.exit`; without arguments of its own it takes `default_args`, the workflow's
    (pkg/apis/workflow/v1alpha1/workflow_types.go GetExitHook, LifecycleHook.WithArgs)."""
    if holder.get("onExit"):
        return {"template": holder["onExit"], "arguments": default_args or {}}
    hook = (holder.get("hooks") or {}).get(EXIT)
    if not isinstance(hook, dict):
        return None
    args = hook.get("arguments") or {}
    if not args.get("parameters") and not args.get("artifacts"):
        args = default_args or {}
    return {**hook, "arguments": args}


def named_hooks(holder: dict) -> dict[str, dict]:
    """The hooks other than `exit`, in the order written (hooks.go skips ExitLifecycleEvent)."""
    return {k: v for k, v in (holder.get("hooks") or {}).items() if k != EXIT}


def split_for_group(later: dict) -> tuple[dict, dict]:
    """The hooks of a looped DAG task: (the named ones, watched on its TaskGroup node; the exit
    hook, run for each item). dag.go executeDAGTask evaluates named hooks on the task's node,
    the TaskGroup, and runs runOnExitNode on each expanded task's node."""
    named = named_hooks(later)
    rest = {k: v for k, v in later.items() if k != "hooks"}
    if EXIT in (later.get("hooks") or {}):
        rest["hooks"] = {EXIT: later["hooks"][EXIT]}
    return ({"hooks": named} if named else {}), rest


def hook_node_name(parent: str, hook: str) -> str:
    """hooks.go generateLifeHookNodeName."""
    return f"{parent}.hooks.{hook}"


def on_exit_node_name(parent: str) -> str:
    """workflow/common/util.go GenerateOnExitNodeName."""
    return f"{parent}.onExit"


def problems(holder: dict, templates: dict) -> list[tuple[str, str]]:
    """(field, why) for the `hooks` / `onExit` of a workflow spec or step/task: a hook other than
    `exit` needs an expression (workflow/validate/validate.go validateHooks), which must parse
    (expr.check); each names a template of this manifest."""
    out: list[tuple[str, str]] = []
    if holder.get("onExit") is not None and holder["onExit"] not in templates:
        out.append(("onExit", f"no template named {holder['onExit']!r}"))
    hooks = holder.get("hooks")
    if hooks is None:
        return out
    if not isinstance(hooks, dict):
        return [*out, ("hooks", "expected a mapping of hook name to hook")]
    if len(hooks) > MAX_HOOKS:
        return [*out, ("hooks", f"{len(hooks)} hooks: at most {MAX_HOOKS}")]
    for name, hook in hooks.items():
        where = f"hooks.{name}"
        if not isinstance(hook, dict):
            out.append((where, "expected a mapping"))
            continue
        out += [(f"{where}.{k}", "not a hook field") for k in hook if k not in _HOOK_FIELDS]
        if "templateRef" in hook:
            why = "templates of other WorkflowTemplates cannot be resolved locally"
            out.append((f"{where}.templateRef", why))
        elif hook.get("template") not in templates:
            out.append((f"{where}.template", f"no template named {hook.get('template')!r}"))
        text = to_str(hook.get("expression") or "")
        if name != EXIT and not text:
            out.append((where, "Expression required"))  # validate.go validateHooks
        elif text:
            try:
                expr.check(text)
            except expr.ExprError as exc:
                out.append((f"{where}.expression", str(exc)))
    return out


def workflow_status(run: cx.Run, phase: str | None = None) -> str:
    """`workflow.status`: the phase of the workflow's root node as a workflow phase
    (context.workflow_phase); `phase` stands for the root's (a phase it entered, its final)."""
    if phase is None:
        return run.global_vars()["workflow.status"]
    return cx.workflow_phase(phase)


def fires(expression: str, flat: dict[str, str]) -> bool:
    """Whether a hook's expression is true now (util/expr/argoexpr EvalBool: a result that is
    not a boolean is an error); ExprError says why it cannot be evaluated."""
    value = expr.evaluate(expression, expr.expand(flat))
    if not isinstance(value, bool):
        raise expr.ExprError(f"unable to cast expression result {value!r} to bool")
    return value


def resolve_arguments(arguments: dict | None, values: dict[str, str]) -> tuple[dict, list]:
    """A hook's arguments substituted with `values` (unknown tags stay, as Argo's
    ReplaceStrictAny without strict prefixes leaves them): (parameters by name, artifacts)."""
    args = substitute(arguments or {}, values)
    params = {
        p["name"]: to_str(p.get("value", ""))
        for p in args.get("parameters") or []
        if isinstance(p, dict) and "name" in p
    }
    return params, list(args.get("artifacts") or [])


class ExitScope(cx.Scope):
    """The scope of an exit handler: it still runs once the workflow's or a template's deadline
    passed (operator.go executeTemplate lets `opts.onExitTemplate` through, the pod gets
    `onExitPod`), but Ctrl-C stops it like everything else."""

    def reason(self) -> tuple[str, str] | None:
        if self._reason is not None:
            return self._reason
        outer = self.parent.reason() if self.parent is not None else None
        return outer if outer is not None and outer[0] == cx.INTERRUPT else None


@dataclass
class _Watch:
    """The hooks of one step/task node and what they started."""

    node: Node
    hooks: dict[str, dict]  # named hooks (not exit)
    exit: dict | None
    values: dict[str, str]  # the step's scope when it was planned (children.plan)
    ref: str  # `steps.NAME` / `tasks.NAME`: where its status and outputs are in scope
    boundary_id: str
    scope: cx.Scope
    fired: dict[str, Node] = field(default_factory=dict)
    seen: int = 0  # how many phases of node.history were evaluated
    error: str = ""
    done: threading.Event = field(default_factory=threading.Event)

    def hooks_fulfilled(self) -> bool:
        return all(n.fulfilled for n in self.fired.values())


def watch_step(
    run: cx.Run, node: Node, spec: dict, values: dict[str, str], ref: str, boundary_id: str,
    scope: cx.Scope,
) -> None:  # fmt: skip
    """Watch a started step/task `node` with hooks in `spec` (its `hooks` / `onExit`, items
    substituted): fire its hooks and its exit handler in a thread; `settled` says when done."""
    default = {"parameters": [{"name": k, "value": v} for k, v in run.parameters.items()]}
    w = _Watch(node, named_hooks(spec), exit_hook(spec, default), values, ref, boundary_id, scope)
    if not w.hooks and w.exit is None:
        return
    run.hook_watches[node.id] = w
    run.start_thread(_watch_loop, run, w)


def settled(run: cx.Run, nodes: list[Node]) -> bool:
    """Whether every hook and exit handler of these step/task nodes has finished (a daemoned
    step's hooks once those it started finished), so their group or DAG may go on."""
    for n in nodes:
        w = run.hook_watches.get(getattr(n, "id", None))
        if w is None or w.done.is_set():
            continue
        daemoned = n.daemoned and n.phase == RUNNING
        if not (daemoned and w.hooks_fulfilled() and not w.error):
            return False
    return True


def _step_values(run: cx.Run, w: _Watch, phase: str | None = None) -> dict[str, str]:
    """The scope of a step's hooks: the step's scope, the workflow's status, the step's own
    status (steps.go / dag.go set it before evaluating hooks) and, once done, its outputs."""
    values = {**w.values, "workflow.status": workflow_status(run)}
    if w.node.phase in DONE:
        values.update(cx.node_vars(w.ref, w.node))
    values[f"{w.ref}.status"] = phase or w.node.phase
    return values


def _fire(run: cx.Run, w: _Watch) -> None:
    """Start each named hook whose expression is true at a phase the node entered since the last
    look (hooks.go executeTmplLifeCycleHook); an expression error stops the watch."""
    history = list(w.node.history)
    for phase in history[w.seen :]:
        for name, hook in w.hooks.items():
            if name in w.fired:
                continue
            values = _step_values(run, w, phase)
            try:
                go = fires(to_str(hook.get("expression")), values)
            except expr.ExprError as exc:
                w.error = f"hooks.{name}: {exc}"
                return
            if go:
                w.fired[name] = _start_hook(
                    run, hook, values, hook_node_name(w.node.name, name),
                    f"{w.node.display_name}.hooks.{name}", w.node, w.boundary_id, w.scope,
                )  # fmt: skip
    w.seen = len(history)


def _start_hook(
    run: cx.Run, hook: dict, values, name: str, display: str, parent: Node, boundary_id, scope
) -> Node:
    """Start a hook's (or exit handler's) template as node `name` below `parent`, its arguments
    resolved in `values`: the one way a step's, a task's and the workflow's hooks start."""
    params, artifacts = resolve_arguments(hook.get("arguments"), values)
    return run.dispatch.start(
        run, name=name, display=display, template=hook["template"], args=params,
        artifacts=artifacts, boundary_id=boundary_id, parents=[parent], scope=scope,
    )  # fmt: skip


def _wait(run: cx.Run, done) -> None:
    while not done():
        gen = run.store.generation
        if done():
            return
        run.store.wait_change(gen, 0.1)


def _watch_loop(run: cx.Run, w: _Watch) -> None:
    """Fire the named hooks at each phase until the node is done and what they started has
    finished, then the exit handler; an expression error makes the node Error."""
    try:
        _wait(run, lambda: _fire(run, w) or w.error or w.node.phase in DONE)
        _fire(run, w)  # the phases it entered last
        _wait(run, w.hooks_fulfilled)
        if not w.error and w.exit is not None and w.node.completed and not w.node.daemoned:
            _run_exit(run, w)
    except Exception as exc:  # a bug or an unforeseen manifest: on the node, never a hang
        w.error = w.error or f"hooks: {type(exc).__name__}: {exc}"
    finally:
        if w.error:
            _wait(run, lambda: w.node.phase in DONE)
            run.store.update(w.node, phase=ERROR, message=w.error)
        w.done.set()


def _run_exit(run: cx.Run, w: _Watch) -> None:
    """exit_handler.go runOnExitNode: an exit hook's own expression, if any, decides."""
    values = _step_values(run, w)
    text = to_str(w.exit.get("expression") or "")
    try:
        if text and not fires(text, values):
            return
    except expr.ExprError as exc:
        w.error = f"hooks.{EXIT}: {exc}"
        return
    handler = _start_hook(
        run, w.exit, values, on_exit_node_name(w.node.name), f"{w.node.display_name}.onExit",
        w.node, w.boundary_id, ExitScope(w.scope),
    )  # fmt: skip
    _wait(run, lambda: handler.fulfilled)


class WorkflowHooks:
    """The workflow's named hooks (`spec.hooks` but `exit`), watched on its root node
    (hooks.go executeWfLifeCycleHook: evaluated with `workflow.status` and the workflow's
    values; nodes `<workflow>.hooks.<name>` below the root, no boundary; the workflow ends only
    once those started have finished, before its exit handler runs: operator.go)."""

    def __init__(self, run: cx.Run, root: Node, scope: cx.Scope) -> None:
        self.run, self.root, self.scope = run, root, scope
        self.hooks = named_hooks(run.spec)
        self.fired: dict[str, Node] = {}
        self.seen, self.error = 0, ""
        self.lock = threading.Lock()  # the watching thread and `finish` never start one twice

    def poll(self, final: str | None = None) -> None:
        """Start each hook true at a phase the root entered since the last poll (`final`: the
        workflow's phase once decided, e.g. Failed by its deadline)."""
        with self.lock:
            self._poll(final)

    def _poll(self, final: str | None) -> None:
        history = list(self.root.history)
        phases = [*history[self.seen :], *([final] if final else [])]
        self.seen = len(history)
        for phase in phases:
            values = {**self.run.global_vars(), "workflow.status": workflow_status(self.run, phase)}
            for name, hook in self.hooks.items():
                if name in self.fired or self.error:
                    continue
                try:
                    go = fires(to_str(hook.get("expression")), values)
                except expr.ExprError as exc:
                    self.error = f"hooks.{name}: {exc}"
                    return
                if go:
                    self.fired[name] = self._start(name, hook, values)

    def _start(self, name: str, hook: dict, values: dict[str, str]) -> Node:
        full = hook_node_name(self.run.name, name)  # no boundary: the workflow's own
        return _start_hook(self.run, hook, values, full, full, self.root, None, self.scope)

    def watch(self) -> None:
        """Poll until the root node is done (a thread of the run)."""
        if not self.hooks:
            return
        _wait(self.run, lambda: self.poll() or self.error or self.root.phase in DONE)

    def finish(self, final: str) -> list[Node]:
        """Poll with the workflow's final phase; return the hook nodes started, for the caller
        to wait for (Ctrl-C in hand) before the exit handler."""
        if self.hooks:
            self.poll(final)
        with self.lock:
            return list(self.fired.values())


def exit_failure(phase: str, handler: Node) -> tuple[str, str] | None:
    """operator.go: a Succeeded workflow whose exit handler Failed is Failed, one whose handler
    Errored is Error, with the handler's message; any other outcome stands."""
    if phase != SUCCEEDED or handler.phase not in (FAILED, ERROR):
        return None
    return handler.phase, handler.message

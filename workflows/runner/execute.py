"""Invoke one template as one node: bind inputs, apply retryStrategy, dispatch by kind.

`start` creates the node at once (so schedulers see it immediately) and runs the body in a
thread; the body gathers `{{inputs.*}}`, `{{workflow.*}}` and `{{retries}}` and hands the template
to the executor of its kind, found in `run.dispatch` (leaf, DAG or steps: see workflow.py), never
imported from here. `run_group` is what DAG and steps templates share around their executor.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable

from ckptflow.workflows.runner import artifacts as arts
from ckptflow.workflows.runner import context as cx
from ckptflow.workflows.runner import memo as memos
from ckptflow.workflows.runner import sync
from ckptflow.workflows.runner.expr_fields import (
    RETRY_FALSE,
    output_expression,
    retry_continues,
    retry_policy,
)
from ckptflow.workflows.runner.nodes import ERROR, FAILED, RUNNING, SUCCEEDED, Node
from ckptflow.workflows.runner.substitution import parse_duration, substitute, to_str, unresolved

__all__ = ["add_hostnames_to_affinity", "start", "kind_of", "run_group"]

# Argo's RETRY_HOST_NAME_LABEL_KEY default (workflow/controller/retry_tweak.go)
HOST_LABEL = "kubernetes.io/hostname"

# A DAG/steps executor: (run, node, substituted body, scope) -> (phase, message, local variables)
GroupBody = Callable[[cx.Run, Node, dict, cx.Scope], tuple[str, str, dict]]


def kind_of(run: cx.Run, tmpl: dict) -> cx.Kind:
    """The Kind of a template: the first key of `run.dispatch.kinds` it has."""
    return next(kind for key, kind in run.dispatch.kinds.items() if key in tmpl)


def bind_inputs(tmpl: dict, args: dict[str, str]) -> list[dict]:
    """The template's input parameters with caller arguments applied; raises on a missing one."""
    bound = []
    for p in (tmpl.get("inputs") or {}).get("parameters") or []:
        name = p["name"]
        value = args[name] if name in args else cx.param_value(p)
        if value is None:
            raise ValueError(
                f"inputs.parameters.{name} was not supplied to template {tmpl['name']!r}"
            )
        enum = p.get("enum")
        if enum and value not in [to_str(e) for e in enum]:
            raise ValueError(f"inputs.parameters.{name}={value!r} is not one of {enum}")
        bound.append({"name": name, "value": value})
    return bound


def start(
    run: cx.Run,
    *,
    name: str,
    display: str,
    template: str,
    args: dict[str, str],
    boundary_id: str | None,
    parents: list[Node],
    scope: cx.Scope,
    artifacts: list[dict] | None = None,
) -> Node:
    """Create the node for invoking `template` and start running it in a thread
    (`artifacts`: the caller's `arguments.artifacts`, references already substituted)."""
    tmpl = run.templates[template]
    strategy = tmpl.get("retryStrategy")
    if strategy is None and kind_of(run, tmpl).node_type == "Pod":
        strategy = run.spec.get("retryStrategy")  # the workflow's default, for leaf templates
    node_type = "Retry" if strategy is not None else kind_of(run, tmpl).node_type
    node = run.store.create(
        name, display, node_type, template_name=template, boundary_id=boundary_id, parents=parents
    )
    try:
        inputs = bind_inputs(tmpl, args)
        node.input_artifacts = arts.bind(tmpl, artifacts or []) or None
    except ValueError as exc:
        run.store.update(node, phase=ERROR, message=str(exc))
        return node
    node.inputs = inputs or None
    memo = None
    if tmpl.get("memoize") is not None:
        try:
            memo, cached = _memo_lookup(run, tmpl, inputs)
        except memos.MemoError as exc:
            run.store.update(node, phase=ERROR, message=str(exc))
            return node
        if cached is not None:  # a hit: Succeeded at once, typed as its template's node
            run.store.update(
                node, type=kind_of(run, tmpl).node_type, phase=SUCCEEDED,
                outputs=cached or None, memoization_status=memo.status(True),
            )  # fmt: skip
            return node
        run.store.update(node, memoization_status=memo.status(False))
    if strategy is not None:  # limit/backoff may use {{inputs.parameters.X}} or workflow values
        values = run.global_vars()
        values.update({f"inputs.parameters.{p['name']}": p["value"] for p in inputs})
        strategy = substitute(strategy, values)
        body, body_args = _retry_guarded, (tmpl, inputs, strategy, boundary_id, scope)
    else:
        body, body_args = _guarded, (tmpl, inputs, 0, boundary_id, scope, None)
    run.start_thread(_then_save, run, node, memo, body, body_args)
    return node


def _memo_lookup(run: cx.Run, tmpl: dict, inputs: list[dict]) -> tuple[memos.Memo, dict | None]:
    """The node's memo (its key substituted with the workflow values and the template's inputs,
    as Argo's processedTmpl) and the cached outputs of a hit, else None (memo.py)."""
    values = run.global_vars()
    for p in inputs:
        values[f"inputs.parameters.{p['name']}"] = substitute(p["value"], values)
    memo = memos.Memo(run.memo_cache, run.namespace, substitute(tmpl["memoize"], values))
    return memo, memos.lookup(memo)


def _then_save(run: cx.Run, node: Node, memo, body, body_args: tuple) -> None:
    """Run the node's body; a memoized node that Succeeded saves its outputs under its key
    (operator.go: a cache that cannot be written makes the node Error)."""
    body(run, node, *body_args)
    if memo is None or node.phase != SUCCEEDED:
        return
    try:
        memos.save(memo, node.id, node.outputs)
    except memos.MemoError as exc:
        run.store.update(node, phase=ERROR, message=str(exc))


def _guarded(run, node, tmpl, inputs, retries, boundary_id, scope, on_daemon) -> None:
    """Run a node body; an unexpected exception becomes the node's Error, never a hang."""
    try:
        run_once(run, node, tmpl, inputs, retries, boundary_id, scope, on_daemon)
    except Exception as exc:  # a bug or an unforeseen manifest: report it on the node
        run.store.update(node, phase=ERROR, message=f"{type(exc).__name__}: {exc}")


def _retry_allowed(policy: str, phase: str) -> bool:
    return {
        "Always": phase in (FAILED, ERROR),
        "OnFailure": phase == FAILED,
        "OnError": phase == ERROR,
        "OnTransientError": phase == ERROR,
    }[policy]


def _retry_guarded(run, node, *args) -> None:
    try:
        _retry_body(run, node, *args)
    except Exception as exc:  # e.g. a limit that is not a number: fail the node, never hang
        run.store.update(node, phase=ERROR, message=f"retryStrategy: {type(exc).__name__}: {exc}")


def _retry_body(run, node, tmpl, inputs, strategy, boundary_id, scope) -> None:
    limit = strategy.get("limit")
    limit = None if limit is None else int(to_str(limit))
    policy = retry_policy(strategy)  # Always when an expression decides
    backoff = strategy.get("backoff") or {}
    first = time.monotonic()
    attempt = 0
    run.store.update(node, phase=RUNNING)

    def mirror(child: Node) -> None:  # a daemoned attempt makes the Retry node daemoned too
        run.store.update(node, daemoned=True, pod_ip=child.pod_ip, phase=RUNNING)

    while True:
        child = run.store.create(
            f"{node.name}({attempt})",
            f"{node.display_name}({attempt})",
            kind_of(run, tmpl).node_type,
            template_name=tmpl["name"],
            boundary_id=boundary_id,
            parents=[node],
            created=attempt_created(node, attempt),
        )
        child.inputs, child.input_artifacts = node.inputs, node.input_artifacts
        attempt_tmpl = retry_on_different_host(run, node, tmpl, strategy)
        _guarded(run, child, attempt_tmpl, inputs, attempt, boundary_id, scope, mirror)
        done = child.phase == SUCCEEDED or not _retry_allowed(policy, child.phase)
        message = child.message
        if not done and limit is not None and attempt >= limit:
            done, message = True, "No more retries left"
        if not done and not retry_continues(strategy, attempt + 1, child):  # ExprError: Error
            done, message = True, RETRY_FALSE
        if not done and scope.reason() is not None:
            done = True
        delay = 0.0
        if not done and backoff.get("duration") is not None:
            delay = (
                parse_duration(backoff["duration"]) * float(backoff.get("factor") or 1) ** attempt
            )
            if backoff.get("cap") is not None:
                delay = min(delay, parse_duration(backoff["cap"]))
            if backoff.get("maxDuration") is not None:
                max_s = parse_duration(backoff["maxDuration"])
                if time.monotonic() + delay - first > max_s:
                    done, message = True, "Max duration limit exceeded"
        if done:
            run.store.update(
                node,
                phase=child.phase,
                message=message if child.phase != SUCCEEDED else child.message,
                outputs=child.outputs,
                exit_code=child.exit_code,
                pod_ip=child.pod_ip,
                attempts=attempt + 1,
                daemoned=child.daemoned and child.phase == RUNNING,
            )
            return
        run.store.update(node, attempts=attempt + 1)
        end = time.monotonic() + delay
        while scope.reason() is None and (left := end - time.monotonic()) > 0:
            time.sleep(min(0.05, left))
        attempt += 1


def attempt_created(retry: Node, attempt: int) -> int | None:
    """When the controller creates the pod of `retry`'s attempt `attempt`: the first in the
    same pass as its Retry node (workflow/controller/operator.go executeTemplate initializes
    the Retry node, then executeContainer creates the pod), so it takes the Retry node's place
    in the walk's order (dag.go creates a task's items in item order) though its thread runs
    later; a later attempt when the retry is made (None: now)."""
    return retry.created if attempt == 0 else None


def fail_hosts(run: cx.Run, retry: Node) -> list[str]:
    """The nodes where pods under `retry` failed or errored, in the order found, each once
    (workflow/util/retry/retry.go GetFailHosts: the subtree's Failed/Error Pod nodes)."""
    hosts: list[str] = []
    to_visit = [retry.id]
    while to_visit:
        node = run.store.nodes.get(to_visit.pop())
        if node is None:
            continue
        failed = node.phase in (FAILED, ERROR) and node.type == "Pod"
        if failed and node.host_node_name and node.host_node_name not in hosts:
            hosts.append(node.host_node_name)
        to_visit.extend(node.children)
    return hosts


def add_hostnames_to_affinity(label: str, hosts: list[str], affinity: dict | None) -> dict | None:
    """`affinity` (not changed) with `label NotIn hosts` required, merged as Argo merges it
    (workflow/util/retry/retry.go AddHostnamesToAffinity): into an existing NotIn expression on
    `label`, else appended to the first term (or to the first term with no expressions)."""
    if not hosts:
        return affinity
    expr = {"key": label, "operator": "NotIn", "values": list(hosts)}
    out = copy.deepcopy(affinity) if affinity else {}
    node_affinity = out.setdefault("nodeAffinity", {})
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    terms = required.get("nodeSelectorTerms") or []
    required["nodeSelectorTerms"] = terms
    if not terms:
        terms.append({"matchExpressions": [expr]})
        return out
    for term in terms:
        exprs = term.get("matchExpressions") or []
        if not exprs:
            term["matchExpressions"] = [expr]
            return out
        for e in exprs:
            if e.get("key") == label and e.get("operator") == "NotIn":
                e["values"] = list(dict.fromkeys([*(e.get("values") or []), *hosts]))
                return out
    terms[0]["matchExpressions"] = [*terms[0]["matchExpressions"], expr]
    return out


def retry_on_different_host(run: cx.Run, retry: Node, tmpl: dict, strategy: dict) -> dict:
    """The template of a retry's next attempt: with `retryStrategy.affinity.nodeAntiAffinity`,
    the hosts of the failed attempts become a required node anti-affinity of its pod
    (workflow/controller/retry_tweak.go RetryOnDifferentHost). The scheduler reads it from the
    pod's `affinity` (placement.pod_request); without a cluster model the runner is one node,
    this machine, so such a retry stays Pending until a deadline ends it, as on a one-node
    cluster (leaf.py)."""
    if (strategy.get("affinity") or {}).get("nodeAntiAffinity") is None:
        return tmpl
    hosts = fail_hosts(run, retry)
    if not hosts:
        return tmpl
    return {**tmpl, "affinity": add_hostnames_to_affinity(HOST_LABEL, hosts, tmpl.get("affinity"))}


def run_once(
    run: cx.Run,
    node: Node,
    tmpl: dict,
    inputs: list[dict],
    retries: int,
    boundary_id: str | None,
    scope: cx.Scope,
    on_daemon: Callable[[Node], None] | None,
) -> None:
    """Run one attempt of a template as `node` (blocking until it ends or is stopped)."""
    values = run.global_vars()
    # defaults may refer to workflow variables (Argo fills those in everywhere first)
    inputs = [{"name": p["name"], "value": substitute(p["value"], values)} for p in inputs]
    values.update({f"inputs.parameters.{p['name']}": p["value"] for p in inputs})
    if inputs:
        run.store.update(node, inputs=inputs)
    values["inputs.parameters"] = json.dumps(inputs, separators=(",", ":"))
    if node.input_artifacts:  # a template's own s3.key may use {{inputs.parameters.x}}
        node.input_artifacts = substitute(node.input_artifacts, values)
    values.update(arts.input_values(node.input_artifacts))
    values["retries"] = str(retries)
    values["pod.name"] = node.id
    values["node.name"] = node.name
    values.update(_invoker_name(run, node, retries))
    with sync.hold(
        substitute(tmpl.get("synchronization"), values), lock_dir=run.lock_dir,
        namespace=run.namespace, limits=run.semaphore_limits,
        waiting=lambda msg: run.store.update(node, message=msg),
        should_stop=lambda: scope.reason() is not None,
    ) as held:  # fmt: skip
        if not held:
            run.store.update(node, phase=FAILED, message=scope.reason()[1])
            return
        if node.message.startswith("Waiting for"):
            run.store.update(node, message="")
        kind_of(run, tmpl).run(run, node, tmpl, values, scope, on_daemon)


def _invoker_name(run: cx.Run, node: Node, retries: int) -> dict[str, str]:
    """`{{steps.name}}` / `{{tasks.name}}` in a template's body: the step or task that invoked
    it (its display name, without the attempt suffix of a retried one)."""
    display = node.display_name
    retried = node.name.removesuffix(f"({retries})")
    if retried != node.name and retried in run.store.by_name:
        display = display.removesuffix(f"({retries})")
    boundary = run.store.nodes.get(node.boundary_id or "")
    if boundary is None:
        return {}
    kind = {"Steps": "steps", "DAG": "tasks"}.get(boundary.type)
    return {f"{kind}.name": display} if kind else {}


def run_group(
    run_body: GroupBody,
    run: cx.Run,
    node: Node,
    tmpl: dict,
    values: dict[str, str],
    scope: cx.Scope,
    on_daemon: Callable[[Node], None] | None,
) -> None:
    """One attempt of a DAG/steps template: substitute, run its children with `run_body` within
    the template's deadline, then collect the template's outputs. With `run_body` bound
    (`partial`), this is those kinds' `Kind.run`; `on_daemon` is unused (only pods are daemons)."""
    body = substitute(tmpl, values)
    deadline = cx.template_deadline(body)  # ValueError (a bad substituted one): the node's Error
    inner = scope.child(deadline, cx.DEADLINE) if deadline is not None else scope
    run.store.update(node, phase=RUNNING)
    phase, message, local = run_body(run, node, body, inner)
    outputs = None
    if phase == SUCCEEDED:
        try:
            outputs = template_outputs(run, body, {**values, **local})  # inputs: expressions
        except ValueError as exc:
            phase, message = ERROR, str(exc)
    if inner is not scope and inner.reason() and phase != SUCCEEDED:
        message = inner.reason()[1]
    run.store.update(node, phase=phase, message=message, outputs=outputs)


def template_outputs(run: cx.Run, body: dict, local: dict[str, str]) -> dict | None:
    """Outputs of a DAG/steps template from `valueFrom.parameter` (or `value`) references or
    `valueFrom.expression` over `local` (the template's inputs and children's outputs)."""
    params = []
    for p in (body.get("outputs") or {}).get("parameters") or []:
        vf = p.get("valueFrom") or {}
        if vf.get("expression") is not None:  # expr_fields.py
            value = output_expression(p["name"], vf, local)
            params.append({"name": p["name"], "value": value})
            if p.get("globalName"):
                run.global_outputs[p["globalName"]] = value
            continue
        raw = vf.get("parameter", p.get("value"))
        if raw is None:
            if vf.get("default") is None:
                raise ValueError(f"output parameter {p['name']!r} needs valueFrom.parameter")
            raw = vf["default"]
        value = substitute(to_str(raw), local)
        if unresolved(value):
            if vf.get("default") is None:
                raise ValueError(
                    f"failed to resolve {unresolved(value)[0]} for output {p['name']!r}"
                )
            value = to_str(vf["default"])
        params.append({"name": p["name"], "value": value})
        if p.get("globalName"):
            run.global_outputs[p["globalName"]] = value
    outputs: dict = {"parameters": params} if params else {}
    saved = arts.group_outputs(body, local)
    if saved:
        outputs["artifacts"] = saved
        arts.export(run.global_artifacts, body, saved)
    return outputs or None

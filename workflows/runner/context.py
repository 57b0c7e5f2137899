"""Shared state of one local run, the executors it dispatches to, cancellation scopes, and the
`{{tasks.X...}}` variables.

A Scope is a region of the workflow that can end early: the whole workflow (deadline, Ctrl-C),
a template with its own deadline, or a DAG/steps template whose daemons must stop when it
finishes. Processes poll their scope chain, so ending a scope ends everything under it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ckptflow.workflows.runner.artifacts import output_values
from ckptflow.workflows.runner.nodes import (
    DONE,
    FAILED,
    OMITTED,
    RUNNING,
    SKIPPED,
    SUCCEEDED,
    Node,
    NodeStore,
    rfc3339,
)
from ckptflow.workflows.runner.objects import ObjectStore
from ckptflow.workflows.runner.process import ProcessRegistry
from ckptflow.workflows.runner.substitution import parse_duration, to_str

__all__ = ["Dispatch", "Kind", "Run", "Scope", "node_vars", "aggregate_vars", "LOCAL_IP"]

LOCAL_IP = "127.0.0.1"

# Scope end kinds and the node message Argo shows for each.
INTERRUPT, DEADLINE, TEMPLATE_DEADLINE, SCOPE_END = "interrupt", "deadline", "template", "end"


class Scope:
    """A cancellable region with an optional deadline (monotonic seconds)."""

    def __init__(
        self, parent: Scope | None = None, deadline_s: float | None = None, kind: str = DEADLINE
    ):
        self.parent = parent
        self.deadline = None if deadline_s is None else time.monotonic() + deadline_s
        self.kind = kind
        self._reason: tuple[str, str] | None = None

    def child(self, deadline_s: float | None = None, kind: str = TEMPLATE_DEADLINE) -> Scope:
        return Scope(self, deadline_s, kind)

    def cancel(self, kind: str, message: str) -> None:
        if self._reason is None:
            self._reason = (kind, message)

    def reason(self) -> tuple[str, str] | None:
        """Why this scope (or one around it) ended, or None while it is live."""
        if self._reason is not None:
            return self._reason
        if self.deadline is not None and time.monotonic() >= self.deadline:
            msg = (
                "Max duration limit exceeded"
                if self.kind == DEADLINE
                else "Pod was active on the node longer than the specified deadline"
            )
            self._reason = (self.kind, msg)
            return self._reason
        return self.parent.reason() if self.parent is not None else None


def workflow_phase(root_phase: str) -> str:
    """`{{workflow.status}}`: the workflow phase the root node's phase stands for, set on every
    pass of the controller (workflow/controller/operator.go: Skipped and Omitted are
    Succeeded)."""
    return SUCCEEDED if root_phase in (SKIPPED, OMITTED) else root_phase


def template_deadline(tmpl: dict) -> float | None:
    """A template's own deadline in seconds (the smaller of activeDeadlineSeconds and timeout).
    An empty `timeout` (a workflow parameter left "") is none, as Argo reads it
    (workflow/controller/operator.go checkTemplateTimeouts: `tmpl.Timeout != ""`)."""
    keys = ("activeDeadlineSeconds", "timeout")
    values = [parse_duration(tmpl[k]) for k in keys if k in tmpl and to_str(tmpl[k]).strip()]
    return min(values) if values else None


@dataclass(frozen=True)
class Kind:
    """How one template kind runs: the node type Argo gives it, and one attempt of it,
    `run(run, node, template, values, scope, on_daemon)`, which substitutes `values` into the
    template, runs it and records the outcome on `node`."""

    node_type: str
    run: Callable[..., None]


@dataclass(frozen=True)
class Dispatch:
    """The executors of a run, built by `workflow.py` and handed down in `Run`.

    Executors reach each other only through it, never by importing one another: a DAG's tasks
    start templates again, so execute -> dag_exec -> children -> execute would be an import cycle.
    """

    start: Callable[..., Node]  # invoke a template as a node: `execute.start`
    kinds: dict[str, Kind]  # template key ("container", "dag", ...) -> its Kind, in match order


@dataclass
class Run:
    """Everything the executors of one workflow run share."""

    name: str
    uid: str
    namespace: str
    spec: dict
    templates: dict[str, dict]
    parameters: dict[str, str]
    store: NodeStore
    registry: ProcessRegistry
    workdir: str
    cwd: str | None  # the caller's run_workflow(cwd=); None: each node's own directory
    pod_slots: threading.BoundedSemaphore | None
    dispatch: Dispatch
    private_tmp: bool = True
    isolation: Any = None  # isolation.Isolation when tasks run as pods, else None
    scheduler: Any = None  # scheduler.Scheduler binding pods to nodes under isolation
    env: dict[str, str] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    global_outputs: dict[str, str] = field(default_factory=dict)
    artifacts: Any = None  # the artifact repository (artifact_repo.Repository)
    global_artifacts: dict[str, str] = field(default_factory=dict)  # globalName -> reference
    lock_dir: str = ""  # synchronization locks of this machine (sync.py)
    semaphore_limits: dict[str, int] = field(default_factory=dict)
    memo_cache: str = ""  # the memoization caches' directory (memo.py)
    exit_vars: dict[str, str] = field(default_factory=dict)
    threads: list[threading.Thread] = field(default_factory=list)
    threads_lock: threading.Lock = field(default_factory=threading.Lock)
    # node id -> the lifecycle hooks watching that step/task (hooks.py)
    hook_watches: dict[str, Any] = field(default_factory=dict)
    # the cluster model's API server (objects.py): ConfigMaps, Secrets, the run's Workflow and
    # pods, what resource templates create
    objects: ObjectStore = field(default_factory=ObjectStore)

    def global_vars(self) -> dict[str, str]:
        """`{{workflow.*}}` values visible everywhere."""
        values = {
            "workflow.name": self.name,
            "workflow.uid": self.uid,
            "workflow.namespace": self.namespace,
            "workflow.mainEntrypoint": str(self.spec.get("entrypoint")),
            "workflow.creationTimestamp": rfc3339(self.created) or "",
            # a CronWorkflow's scheduled time; a run by hand is scheduled when it starts
            "workflow.scheduledTime": rfc3339(self.created) or "",
            "workflow.serviceAccountName": str(self.spec.get("serviceAccountName") or "default"),
            "workflow.parameters": json.dumps(
                [{"name": k, "value": v} for k, v in self.parameters.items()], separators=(",", ":")
            ),
            "workflow.duration": f"{time.time() - self.created:.6f}",
        }
        values.update({f"workflow.parameters.{k}": v for k, v in self.parameters.items()})
        if "json" not in self.parameters:  # Argo's name for the list, unless a parameter has it
            values["workflow.parameters.json"] = values["workflow.parameters"]
        values.update(
            {f"workflow.outputs.parameters.{k}": v for k, v in self.global_outputs.items()}
        )
        values.update(
            {f"workflow.outputs.artifacts.{k}": v for k, v in self.global_artifacts.items()}
        )
        # Running until the root node is done (a template that reads it while its root is
        # still Pending is planned on the controller's later passes, when it is Running)
        root = self.store.by_name.get(self.name)
        done = root is not None and root.phase in DONE
        values["workflow.status"] = workflow_phase(root.phase) if done else RUNNING
        values.update(self.exit_vars)  # the exit handler's: the workflow's final status
        return values

    def start_thread(self, target, *args) -> threading.Thread:
        t = threading.Thread(target=target, args=args, daemon=True)
        with self.threads_lock:
            self.threads.append(t)
        t.start()
        return t


def _outputs_vars(prefix: str, outputs: dict | None) -> dict[str, str]:
    values: dict[str, str] = {}
    if not outputs:
        return values
    if outputs.get("result") is not None:
        values[f"{prefix}.outputs.result"] = outputs["result"]
    params = outputs.get("parameters") or []
    for p in params:
        values[f"{prefix}.outputs.parameters.{p['name']}"] = p.get("value", "")
    if params:
        values[f"{prefix}.outputs.parameters"] = json.dumps(
            {p["name"]: p.get("value", "") for p in params}, separators=(",", ":")
        )
    values.update(output_values(prefix, outputs))
    return values


def node_vars(prefix: str, node: Node) -> dict[str, str]:
    """`{{tasks.X.*}}` / `{{steps.X.*}}` values of one finished (or daemoned) node."""
    values = {
        f"{prefix}.id": node.id,
        f"{prefix}.status": node.phase,
        f"{prefix}.startedAt": rfc3339(node.started_at) or "",
        f"{prefix}.finishedAt": rfc3339(node.finished_at) or "",
    }
    if node.pod_ip:
        values[f"{prefix}.ip"] = node.pod_ip
    if node.exit_code is not None:
        values[f"{prefix}.exitCode"] = str(node.exit_code)
    values.update(_outputs_vars(prefix, node.outputs))
    return values


def aggregate_vars(prefix: str, group: Node | None, children: list[Node]) -> dict[str, str]:
    """Outputs of a fanned-out step/task as Argo aggregates them: JSON lists in item order."""
    values = {}
    if group is not None:
        values = {
            f"{prefix}.id": group.id,
            f"{prefix}.status": group.phase,
            f"{prefix}.startedAt": rfc3339(group.started_at) or "",
            f"{prefix}.finishedAt": rfc3339(group.finished_at) or "",
        }
    results: list[Any] = []
    param_maps: list[dict] = []
    per_param: dict[str, list[str]] = {}
    for child in children:
        out = child.outputs or {}
        if child.phase != SUCCEEDED:
            continue
        params = out.get("parameters") or []
        if params:
            param_maps.append({p["name"]: p.get("value", "") for p in params})
            for p in params:
                per_param.setdefault(p["name"], []).append(p.get("value", ""))
        if out.get("result") is not None:
            try:
                results.append(json.loads(out["result"]))
            except ValueError:
                results.append(out["result"])
    compact = {"separators": (",", ":")}
    values[f"{prefix}.outputs.result"] = json.dumps(results, **compact)
    values[f"{prefix}.outputs.parameters"] = json.dumps(param_maps, **compact)
    for name, vals in per_param.items():
        values[f"{prefix}.outputs.parameters.{name}"] = json.dumps(vals, **compact)
    return values


def failures(store: NodeStore) -> str:
    """`{{workflow.failures}}`: the failed pod nodes, as Argo lists them for exit handlers."""
    rows = []
    for n in store.nodes.values():
        if n.phase in (FAILED, "Error") and n.type == "Pod":
            rows.append(
                {
                    "displayName": n.display_name,
                    "message": n.message,
                    "templateName": n.template_name or "",
                    "phase": n.phase,
                    "podName": n.id,
                    "finishedAt": rfc3339(n.finished_at) or "",
                }
            )
    return json.dumps(rows, separators=(",", ":"))


def param_value(p: dict) -> str | None:
    """A parameter's value (or its default), as a string; None when it has neither."""
    if p.get("value") is not None:
        return to_str(p["value"])
    if p.get("default") is not None:
        return to_str(p["default"])
    return None

"""Workflow nodes as Argo records them in `status.nodes`, kept in one thread-safe store.

Executors wait on the store's change counter, so a task finishing anywhere wakes exactly the
schedulers that may now start something (no lost wake-ups, no busy loops).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "PENDING",
    "RUNNING",
    "SUCCEEDED",
    "FAILED",
    "ERROR",
    "SKIPPED",
    "OMITTED",
    "COMPLETED",
    "Node",
    "NodeStore",
    "rfc3339",
]

PENDING, RUNNING, SUCCEEDED, FAILED, ERROR = "Pending", "Running", "Succeeded", "Failed", "Error"
SKIPPED, OMITTED = "Skipped", "Omitted"
COMPLETED = frozenset({SUCCEEDED, FAILED, ERROR})
DONE = COMPLETED | {SKIPPED, OMITTED}


def rfc3339(ts: float | None) -> str | None:
    """Argo's timestamp format (UTC, whole seconds)."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def fnv32a(text: str) -> int:
    h = 0x811C9DC5
    for b in text.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


@dataclass
class Node:
    """One entry of `status.nodes`, plus what the local run adds (log file, precise times)."""

    id: str
    name: str
    display_name: str
    type: str
    template_name: str | None = None
    boundary_id: str | None = None
    phase: str = PENDING
    message: str = ""
    started_at: float | None = None
    finished_at: float | None = None
    children: list[str] = field(default_factory=list)
    inputs: list[dict] | None = None
    input_artifacts: list[dict] | None = None  # bound by artifacts.bind, loaded before a pod runs
    outputs: dict | None = None
    daemoned: bool = False
    pod_ip: str | None = None
    host_node_name: str | None = None  # the cluster node the pod was bound to
    exit_code: int | None = None
    log_file: str | None = None
    attempts: int = 0
    # the order the controller created it in (NodeStore.create), standing for its pod's
    # creationTimestamp: the scheduler binds waiting pods in this order (scheduler.py)
    created: int = 0
    memoization_status: dict | None = None  # {hit, key, cacheName} of a memoized node (memo.py)
    # every phase it entered, in order: a lifecycle hook's expression sees each one, even one a
    # fast pod passed through between two looks (hooks.py)
    history: list[str] = field(default_factory=list)

    @property
    def fulfilled(self) -> bool:
        """Done for the purpose of its dependents: finished, skipped, omitted or daemoned."""
        return self.phase in DONE or (self.daemoned and self.phase == RUNNING)

    @property
    def completed(self) -> bool:
        return self.phase in COMPLETED

    @property
    def duration(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.finished_at or time.time()) - self.started_at

    def _inputs_status(self) -> dict | None:
        out: dict[str, Any] = {"parameters": self.inputs} if self.inputs else {}
        arts = [
            {
                "name": a["name"],
                "path": a.get("path"),
                **({"s3": {"key": a["key"]}} if a.get("key") else {}),
            }
            for a in self.input_artifacts or []
        ]
        if arts:
            out["artifacts"] = arts
        return out or None

    def to_status(self) -> dict[str, Any]:
        """This node as Argo serialises it (camelCase, absent fields left out)."""
        out: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "displayName": self.display_name,
            "type": self.type,
            "phase": self.phase,
            "startedAt": rfc3339(self.started_at),
            "finishedAt": rfc3339(self.finished_at),
        }
        optional = {
            "templateName": self.template_name,
            "boundaryID": self.boundary_id,
            "message": self.message or None,
            "children": list(self.children) or None,
            "inputs": self._inputs_status(),
            "outputs": self.outputs or None,
            "daemoned": True if self.daemoned else None,
            "podIP": self.pod_ip,
            "hostNodeName": self.host_node_name,
            "memoizationStatus": self.memoization_status,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        out["local"] = {
            k: v
            for k, v in {
                "logFile": self.log_file,
                "startedAtUnix": self.started_at,
                "finishedAtUnix": self.finished_at,
                "exitCode": self.exit_code,
                "attempts": self.attempts or None,
            }.items()
            if v is not None
        }
        return out


class NodeStore:
    """All nodes of one run, by id and by name, with a change counter to wait on."""

    def __init__(self, workflow_name: str, on_change: Callable[[Node, str], None] | None = None):
        self.workflow_name = workflow_name
        self.nodes: dict[str, Node] = {}
        self.by_name: dict[str, Node] = {}
        self.cond = threading.Condition(threading.RLock())
        self.generation = 0
        self._on_change = on_change
        self._created = 0

    def node_id(self, name: str) -> str:
        """Argo's node id: the workflow name for the root, else name + FNV-32a of the node name."""
        if name == self.workflow_name:
            return name
        return f"{self.workflow_name}-{fnv32a(name)}"

    def create(
        self,
        name: str,
        display_name: str,
        type_: str,
        *,
        template_name: str | None = None,
        boundary_id: str | None = None,
        parents: list[Node] | tuple = (),
        phase: str = PENDING,
        message: str = "",
        created: int | None = None,
    ) -> Node:
        """Add a node (and link it under its parents); an already known name is an error.
        `created`: its creation order when it is not now (execute.attempt_created)."""
        with self.cond:
            if name in self.by_name:
                raise RuntimeError(f"node {name!r} exists already")
            if created is None:
                self._created += 1
                created = self._created
            node = Node(
                id=self.node_id(name),
                name=name,
                display_name=display_name,
                type=type_,
                template_name=template_name,
                boundary_id=boundary_id,
                phase=phase,
                message=message,
                history=[phase],
                created=created,
            )
            if phase in DONE:
                node.started_at = node.finished_at = time.time()
            self.nodes[node.id] = node
            self.by_name[name] = node
            for parent in parents:
                if node.id not in parent.children:
                    parent.children.append(node.id)
            self._changed(node, "created")
            return node

    def link(self, parent: Node, child: Node) -> None:
        with self.cond:
            if child.id not in parent.children:
                parent.children.append(child.id)
                self._changed(parent, "updated")

    def update(self, node: Node, **fields: Any) -> None:
        """Set fields of a node; entering Running stamps startedAt, finishing stamps finishedAt."""
        with self.cond:
            old_phase = node.phase
            for key, value in fields.items():
                setattr(node, key, value)
            now = time.time()
            if node.phase == RUNNING and node.started_at is None:
                node.started_at = now
            if node.phase in DONE and node.finished_at is None:
                node.started_at = node.started_at or now
                node.finished_at = now
            event = "updated"
            if old_phase != node.phase:
                node.history.append(node.phase)
                event = "finished" if node.phase in DONE else node.phase.lower()
            if fields.get("daemoned"):
                event = "daemoned"
            self._changed(node, event)

    def _changed(self, node: Node, event: str) -> None:
        self.generation += 1
        self.cond.notify_all()
        if self._on_change is not None:
            self._on_change(node, event)

    def wait_change(self, generation: int, timeout: float) -> None:
        """Block until something changes after `generation` (or `timeout` seconds pass)."""
        with self.cond:
            if self.generation == generation:
                self.cond.wait(timeout)

    def to_status(self) -> dict[str, dict]:
        with self.cond:
            return {nid: n.to_status() for nid, n in self.nodes.items()}

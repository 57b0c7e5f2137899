"""Binding the pods of one run to the cluster model's nodes, or why each stays Pending: the
stateful half of a small kube-scheduler, over the filters and first-fit placement of
placement.py.

`Scheduler` accounts what bound pods request (extended resources such as `nvidia.com/gpu` too)
until `release`; waiting pods are bound in the scheduling queue's order (`queue_order`: the
order the controller created them, not the order their executor threads asked), each to the
first node that fits it then (`placement.place`).

Pods of a gang (gang.py: a Kueue pod group, a Volcano or coscheduling PodGroup) are bound all or
nothing: none of them until the gang's size can be placed at once (`place_gang`), as Volcano's
gang plugin allocates a job only when JobReady, Kueue admits a pod group's Workload as a whole,
and coscheduling's Permit releases its waiting pods only at minMember. Coscheduling holds the
waiting pods' resources until its permit timeout; here nothing is held (the state after that
timeout), so a gang that does not fit never starves other pods. Kueue admits against a
ClusterQueue's quota, which is not modelled: here a Kueue group is admitted when it fits the nodes.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from ckptflow.workflows.runner.cluster import Cluster
from ckptflow.workflows.runner.gang import Gang, gang_message, pod_group_size
from ckptflow.workflows.runner.placement import (
    PodRequest,
    add_requests,
    pending_message,
    place,
    place_gang,
)

__all__ = ["Scheduler", "queue_order"]


@dataclass
class _Waiter:
    key: str
    pod: PodRequest
    seq: int  # the order it asked in
    node: str | None = None
    message: str = ""


def queue_order(w: _Waiter) -> tuple[int, int]:
    """Where a waiting pod stands in the scheduling queue: by the order it was created
    (`PodRequest.created`), then the order it asked.

    kube-scheduler's PrioritySort.Less (pkg/scheduler/framework/plugins/queuesort/
    priority_sort.go in kubernetes/kubernetes): higher priority first, then the earlier queue
    timestamp, the time the pod was added to the queue, which follows its creation (the
    controller creates a task's item pods in item order in one pass, dag.go executeDAGTask);
    Volcano's TaskOrderFn default (pkg/scheduler/framework/session_plugins.go in
    volcano-sh/volcano): creationTimestamp, then UID. Priority is not modelled (spec.py
    ignores the priority fields: every pod has one priority). Ordering by creation keeps a
    gang's rank 0 on the first node when its executor thread asks after rank 1's."""
    return (w.pod.created, w.seq)


class Scheduler:
    """Binds pods of one run to the cluster's nodes and accounts their requests until release.

    Waiting pods are bound in the scheduling queue's order (`queue_order`: creation, then
    asking), each to the first node that fits it then; a gang is tried where its first waiting
    pod stands, all its waiting pods at once, in that order (`_admit_gang`).
    `objects` is the run's object store, where Volcano and coscheduling PodGroups are read."""

    def __init__(self, cluster: Cluster, objects=None):
        self.cluster = cluster
        self.objects = objects
        self._cond = threading.Condition()
        self._used: dict[str, dict[str, int]] = {n.name: {} for n in cluster.nodes}
        self._bound: dict[str, tuple[str, PodRequest]] = {}
        self._queue: list[_Waiter] = []
        self._seq = 0

    def _bind_waiter(self, w: _Waiter, node: str) -> None:
        add_requests(self._used[node], w.pod.requests, +1)
        self._bound[w.key] = (node, w.pod)
        w.node = node
        self._queue.remove(w)

    def _drain(self) -> None:
        tried: set[str] = set()
        for w in list(self._queue):
            if w.node is not None:
                continue  # bound with its gang in this pass
            if w.pod.gang is not None:
                if w.pod.gang.key not in tried:
                    tried.add(w.pod.gang.key)
                    self._admit_gang(w.pod.gang)
                continue
            node, message = place(self.cluster, w.pod, self._used)
            if node is None:
                w.message = message
                continue
            self._bind_waiter(w, node)

    def _admit_gang(self, gang: Gang) -> None:
        """Bind the waiting pods of `gang` if, with its pods already bound, its size fits at
        once; otherwise none of them, each waiting with one line naming the gang and the
        capacity missing. Past its size (a retried rank joining a running gang) pods are bound
        one by one as any pod is."""
        members = [w for w in self._queue if w.pod.gang is not None and w.pod.gang.key == gang.key]
        size, why = pod_group_size(gang, self.objects)
        if size is None:
            for w in members:
                w.message = why
            return
        running = [p for _, p in self._bound.values() if p.gang and p.gang.key == gang.key]
        bound = len(running)
        need = size - bound
        if need > len(members):
            # Kueue makes the Workload once every pod of the group exists; coscheduling's
            # PreFilter: "cannot find enough sibling pods"
            message = (
                f"{gang}: {bound + len(members)} of its {size} pods exist; the rest must be "
                "created before any is bound"
            )
            for w in members:
                w.message = message
            return
        nodes, first = place_gang(self.cluster, [w.pod for w in members], self._used)
        if sum(n is not None for n in nodes) < need:
            empty, _ = place_gang(self.cluster, running + [w.pod for w in members[:need]], {})
            fits = bound + sum(n is not None for n in nodes)
            held = sum(n is not None for n in empty)
            message = gang_message(gang, size, fits, members[0].pod.requests, first, held)
            for w in members:
                w.message = message
            return
        for w, node in zip(members, nodes, strict=True):
            if node is not None:
                self._bind_waiter(w, node)
        self._drain_singles([w for w in members if w.node is None])

    def _drain_singles(self, waiters: list[_Waiter]) -> None:
        """Pods of a gang past its size that did not fit: each waits with its own FitError."""
        for w in waiters:
            _, w.message = place(self.cluster, w.pod, self._used)

    def bind(
        self,
        key: str,
        pod: PodRequest,
        stopped: Callable[[], bool],
        on_pending: Callable[[str], None],
    ) -> str | None:
        """The node `pod` is bound to, waiting while none fits (`on_pending(message)` each time
        the reason changes); None when `stopped()` (a deadline, the run's end) came first. A
        gang's pod is tried again when the object store changes (its PodGroup created)."""
        with self._cond:
            self._seq += 1
            waiter = _Waiter(key, pod, self._seq)
            bisect.insort(self._queue, waiter, key=queue_order)
            self._drain()
            self._cond.notify_all()  # a gang's earlier pods may have been bound with this one
        shown, seen = "", self._objects_version()
        while True:
            with self._cond:
                if waiter.node is not None:
                    return waiter.node
                if stopped():
                    self._queue.remove(waiter)
                    return None
                version = self._objects_version()
                if pod.gang is not None and version != seen:
                    seen = version
                    self._drain()
                    self._cond.notify_all()
                    continue
                message = waiter.message
                if message == shown:
                    self._cond.wait(0.05)
                    continue
            shown = message
            on_pending(pending_message(message))

    def _objects_version(self) -> int:
        return self.objects.version if self.objects is not None else 0

    def release(self, key: str) -> None:
        """The pod `key` ended: its requests return to its node; waiting pods are bound."""
        with self._cond:
            bound = self._bound.pop(key, None)
            if bound is None:
                return
            node, pod = bound
            add_requests(self._used[node], pod.requests, -1)
            self._drain()
            self._cond.notify_all()

    def taint(self, node_name: str, taints: tuple[dict, ...]) -> None:
        """Add `taints` to node `node_name` while pods run (the node lifecycle controller's
        `node.kubernetes.io/unreachable`, nodelifecycle.py): pods bound from now on see them."""
        with self._cond:
            nodes = tuple(
                replace(n, taints=n.taints + tuple(t for t in taints if t not in n.taints))
                if n.name == node_name
                else n
                for n in self.cluster.nodes
            )
            self.cluster = replace(self.cluster, nodes=nodes)
            self._drain()
            self._cond.notify_all()

    def used(self, node: str) -> dict[str, int]:
        """What the pods bound to `node` request now (a copy)."""
        with self._cond:
            return dict(self._used.get(node, {}))

"""The creation order the runner gives each pod (runner/nodes.py NodeStore.create,
runner/execute.py attempt_created), which the scheduler binds waiting pods in (scheduler.py
queue_order): the controller's walk order, not the order the executor threads ask."""

from __future__ import annotations

import threading

from ckptflow.workflows.runner.cluster import Cluster, ClusterNode
from ckptflow.workflows.runner.execute import attempt_created
from ckptflow.workflows.runner.nodes import NodeStore
from ckptflow.workflows.runner.placement import pod_request
from ckptflow.workflows.runner.scheduler import Scheduler

GPU = "nvidia.com/gpu"
RANK = {
    "metadata": {
        "labels": {"kueue.x-k8s.io/queue-name": "q", "kueue.x-k8s.io/pod-group-name": "wf"},
        "annotations": {"kueue.x-k8s.io/pod-group-total-count": "2"},
    },
    "container": {"image": "x", "resources": {"limits": {GPU: 1}}},
    "tolerations": [{"key": GPU, "operator": "Exists"}],
}


def _items(store: NodeStore) -> list:
    """Two Retry items created in item order, as the DAG walker creates them (dag.go)."""
    return [store.create(f"wf.rank({i}:{i})", f"rank({i}:{i})", "Retry") for i in range(2)]


def test_nodes_are_numbered_in_the_order_they_are_created():
    store = NodeStore("wf")
    first, second = _items(store)
    assert 0 < first.created < second.created


def test_a_first_attempt_takes_its_retry_nodes_place_a_later_attempt_its_own():
    """The attempts' threads create their nodes in the reverse order (rank 1 first): each
    first attempt still stands where its Retry node was created (operator.go creates the pod in
    the same pass); a retry made afterwards comes after every item."""
    store = NodeStore("wf")
    items = _items(store)
    attempts = {}
    for i in (1, 0):  # the threads' order under load
        retry = items[i]
        attempts[i] = store.create(
            f"{retry.name}(0)", f"{retry.display_name}(0)", "Pod", parents=[retry],
            created=attempt_created(retry, 0),
        )  # fmt: skip
    assert [attempts[i].created for i in (0, 1)] == [items[0].created, items[1].created]
    again = store.create(
        f"{items[0].name}(1)", "rank(0:0)(1)", "Pod", parents=[items[0]],
        created=attempt_created(items[0], 1),
    )  # fmt: skip
    assert again.created > max(n.created for n in store.nodes.values() if n is not again)


def test_rank_pods_built_from_the_nodes_are_bound_in_item_order():
    """Rank 1's thread asks the scheduler first: the pods built from the nodes (isolation.py
    bind_pod) are bound in item order all the same, rank 0 on the first node."""
    store = NodeStore("wf")
    items = _items(store)
    attempts = [
        store.create(f"{r.name}(0)", "a", "Pod", parents=[r], created=attempt_created(r, 0))
        for r in reversed(items)  # the threads' order under load
    ][::-1]
    pods = [pod_request(n.id, RANK, {}, "default", n.created) for n in attempts]
    nodes = tuple(
        ClusterNode(n, {"kubernetes.io/hostname": n}, (), {"cpu": 4000, "pods": 110, GPU: 1})
        for n in ("gpu-0", "gpu-1")
    )
    sched = Scheduler(Cluster(nodes, "test", frozenset(n.name for n in nodes)))
    got: dict[int, str | None] = {}
    pending, stop = threading.Event(), threading.Event()

    def ask(i: int) -> None:
        got[i] = sched.bind(attempts[i].id, pods[i], stop.is_set, lambda _m: pending.set())

    late = threading.Thread(target=ask, args=(1,))  # rank 1's thread asks first
    late.start()
    try:
        assert pending.wait(5)  # waiting for the rest of its gang
        ask(0)
        late.join(5)
        assert got == {0: "gpu-0", 1: "gpu-1"}
    finally:
        stop.set()
        late.join(5)

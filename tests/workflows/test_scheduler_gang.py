"""Gang admission in the local scheduler (runner/gang.py, runner/scheduler.py): a Kueue pod
group, a Volcano or coscheduling PodGroup is bound all or nothing."""

from __future__ import annotations

import threading
import time

import pytest
from ckptflow.workflows.runner.cluster import Cluster, ClusterNode
from ckptflow.workflows.runner.gang import Gang, gang_of, pod_group_size
from ckptflow.workflows.runner.objects import ObjectStore
from ckptflow.workflows.runner.placement import pod_request
from ckptflow.workflows.runner.scheduler import Scheduler

GPU = "nvidia.com/gpu"
TOLERATE = [{"key": GPU, "operator": "Exists"}]


def node(name, cpu=4, gpus=0) -> ClusterNode:
    alloc = {"cpu": cpu * 1000, "memory": 16 << 30, "pods": 110, GPU: gpus}
    return ClusterNode(name, {"kubernetes.io/hostname": name}, (), alloc)


def cluster(*nodes) -> Cluster:
    return Cluster(tuple(nodes), "test", frozenset(n.name for n in nodes))


def kueue_rank(count=2, gpus=1) -> dict:
    return {
        "metadata": {
            "labels": {"kueue.x-k8s.io/queue-name": "q", "kueue.x-k8s.io/pod-group-name": "wf"},
            "annotations": {"kueue.x-k8s.io/pod-group-total-count": str(count)},
        },
        "container": {"image": "x", "resources": {"limits": {GPU: gpus, "cpu": "1"}}},
        "tolerations": TOLERATE,
    }


def volcano_rank(gpus=1) -> dict:
    return {
        "metadata": {"annotations": {"scheduling.k8s.io/group-name": "wf"}},
        "schedulerName": "volcano",
        "container": {"image": "x", "resources": {"limits": {GPU: gpus}}},
    }


def coscheduling_rank(gpus=1) -> dict:
    return {
        "metadata": {"labels": {"scheduling.x-k8s.io/pod-group": "wf"}},
        "schedulerName": "scheduler-plugins-scheduler",
        "container": {"image": "x", "resources": {"limits": {GPU: gpus}}},
    }


def podgroup(api: str, min_member) -> dict:
    return {
        "apiVersion": api,
        "kind": "PodGroup",
        "metadata": {"name": "wf", "namespace": "default"},
        "spec": {"minMember": min_member},
    }


class Binder:
    """Each `bind` in its own thread, as each pod's executor asks; what each saw."""

    def __init__(self, sched: Scheduler):
        self.sched, self.stop = sched, threading.Event()
        self.nodes: dict[str, str | None] = {}
        self.pending: dict[str, list[str]] = {}
        self.threads: list[threading.Thread] = []

    def bind(self, key: str, body: dict, created: int = 0) -> None:
        req = pod_request(key, body, {}, "default", created)
        seen = self.pending.setdefault(key, [])

        def go():
            self.nodes[key] = self.sched.bind(key, req, self.stop.is_set, seen.append)

        t = threading.Thread(target=go)
        t.start()
        self.threads.append(t)

    def wait_pending(self, key: str, timeout=5.0) -> str:
        end = time.time() + timeout
        while not self.pending.get(key) and time.time() < end:
            time.sleep(0.01)
        return self.pending[key][-1]

    def wait_bound(self, *keys: str, timeout=5.0) -> list[str | None]:
        end = time.time() + timeout
        while not all(k in self.nodes for k in keys) and time.time() < end:
            time.sleep(0.01)
        return [self.nodes.get(k) for k in keys]

    def held_gang(self, count: int) -> str:
        """Bind `count` kueue ranks of one gang and check that a while later none is bound;
        the last rank's latest pending line."""
        for i in range(count):
            self.bind(f"rank-{i}", kueue_rank(count))
        self.wait_pending(f"rank-{count - 1}")
        time.sleep(0.2)  # time for a wrong bind to show
        assert self.nodes == {}
        return self.pending[f"rank-{count - 1}"][-1]

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(5)


def test_markings_are_read_as_each_project_documents():
    assert gang_of(kueue_rank(4)) == Gang("kueue", "wf", "default", 4)
    assert gang_of(volcano_rank()) == Gang("volcano", "wf", "default")
    assert gang_of(coscheduling_rank()) == Gang("coscheduling", "wf", "default")
    # Volcano's annotation on a pod of the default scheduler: the default scheduler ignores it
    assert gang_of({**volcano_rank(), "schedulerName": "default-scheduler"}) is None
    # the workflow's schedulerName counts when the template has none (Argo's workflowpod.go)
    no_name = {k: v for k, v in volcano_rank().items() if k != "schedulerName"}
    assert gang_of(no_name, {"schedulerName": "volcano"}).scheduler == "volcano"
    # a Kueue group name without the queue: Kueue leaves the pod alone
    body = kueue_rank()
    del body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    assert gang_of(body) is None
    assert gang_of({"container": {}}) is None


@pytest.mark.parametrize(
    "count, why",
    [
        (None, "needs the annotation kueue.x-k8s.io/pod-group-total-count"),
        ("two", "'two' is not a whole number"),
        ("0", "0 is not between 1 and 100000"),
    ],
)
def test_a_bad_kueue_group_is_one_line_naming_the_annotation(count, why):
    body = kueue_rank()
    if count is None:
        del body["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"]
    else:
        body["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] = count
    with pytest.raises(ValueError) as err:
        pod_request("rank-0", body)
    assert str(err.value).startswith("pod rank-0: ") and why in str(err.value)
    assert "\n" not in str(err.value)


def test_podgroup_size_is_its_min_member_of_its_own_api_group():
    store = ObjectStore()
    volcano = Gang("volcano", "wf", "default")
    size, why = pod_group_size(volcano, store)
    assert size is None and why.startswith("volcano pod group default/wf: PodGroup not found")
    # a coscheduling PodGroup of that name is not Volcano's
    store.create(podgroup("scheduling.x-k8s.io/v1alpha1", 3))
    assert pod_group_size(volcano, store)[0] is None
    assert pod_group_size(Gang("coscheduling", "wf", "default"), store) == (3, "")
    store.delete("PodGroup", "wf")
    store.create(podgroup("scheduling.volcano.sh/v1beta1", "3"))  # a string: not an int32
    assert "spec.minMember '3' is not a whole number" in pod_group_size(volcano, store)[1]


def test_a_gang_that_fits_binds_together():
    """Two GPU ranks, two one-GPU nodes: the first waits until the second exists, then both
    are bound at once, one per node."""
    b = Binder(Scheduler(cluster(node("gpu-0", gpus=1), node("gpu-1", gpus=1))))
    try:
        b.bind("rank-0", kueue_rank(2))
        first = b.wait_pending("rank-0")
        assert first == (
            "Unschedulable: kueue pod group default/wf: 1 of its 2 pods exist; the rest must be "
            "created before any is bound"
        )
        assert "rank-0" not in b.nodes  # not bound alone although it fits
        b.bind("rank-1", kueue_rank(2))
        assert sorted(b.wait_bound("rank-0", "rank-1")) == ["gpu-0", "gpu-1"]
    finally:
        b.finish()


def test_a_gang_is_bound_in_the_order_its_pods_were_created_not_the_order_they_asked():
    """Rank 1's pod asks first (its executor thread ran first, as under load), rank 0's was
    created first (the controller creates a task's item pods in item order, dag.go): bound as
    created, rank 0 on the first node (PrioritySort's queue timestamp, Volcano's TaskOrderFn
    by creationTimestamp)."""
    b = Binder(Scheduler(cluster(node("gpu-0", gpus=1), node("gpu-1", gpus=1))))
    try:
        b.bind("rank-1", kueue_rank(2), created=2)
        b.wait_pending("rank-1")  # asked first, waiting for its gang
        b.bind("rank-0", kueue_rank(2), created=1)
        assert b.wait_bound("rank-0", "rank-1") == ["gpu-0", "gpu-1"]
    finally:
        b.finish()


def test_single_pods_waiting_for_a_node_are_bound_in_creation_order():
    """Two one-GPU pods wait for the one GPU: the one created first is bound when it frees,
    though it asked second; the other stays Pending."""
    sched = Scheduler(cluster(node("gpu-0", gpus=1)))
    gpu = {"container": {"resources": {"limits": {GPU: 1}}}, "tolerations": TOLERATE}
    assert sched.bind("other", pod_request("other", gpu), lambda: False, print) == "gpu-0"
    b = Binder(sched)
    try:
        b.bind("late", gpu, created=2)
        b.wait_pending("late")
        b.bind("early", gpu, created=1)
        b.wait_pending("early")
        sched.release("other")
        assert b.wait_bound("early") == ["gpu-0"]
        time.sleep(0.2)  # time for a wrong bind to show
        assert "late" not in b.nodes
    finally:
        b.finish()


def test_a_partial_fit_binds_nothing_until_the_whole_gang_fits():
    """Three GPUs, one taken by another pod: two of the three ranks would fit, none is bound;
    when the GPU is released all three are bound together."""
    sched = Scheduler(cluster(*(node(f"gpu-{i}", gpus=1) for i in range(3))))
    other = pod_request("other", {"container": {"resources": {"limits": {GPU: 1}}}})
    assert sched.bind("other", other, lambda: False, print) == "gpu-0"
    b = Binder(sched)
    try:
        message = b.held_gang(3)
        assert sched.used("gpu-1") == {} and sched.used("gpu-2") == {}  # nothing held
        assert message == (
            "Unschedulable: kueue pod group default/wf: 3 pods must be bound together, 2 fit "
            "now; missing capacity for 1 pod(s) of cpu 1, nvidia.com/gpu 1: 0/3 nodes are "
            "available: 3 Insufficient nvidia.com/gpu."
        )
        sched.release("other")
        assert sorted(b.wait_bound("rank-0", "rank-1", "rank-2")) == ["gpu-0", "gpu-1", "gpu-2"]
    finally:
        b.finish()


def test_a_gang_that_never_fits_stays_pending_with_its_missing_capacity():
    """Four one-GPU ranks on two GPUs: never; the line names the gang and what is missing."""
    b = Binder(Scheduler(cluster(node("cpu-0"), node("gpu-0", gpus=1), node("gpu-1", gpus=1))))
    try:
        assert b.held_gang(4) == (
            "Unschedulable: kueue pod group default/wf: 4 pods must be bound together, 2 fit "
            "now; it never fits: the empty cluster holds 2; missing capacity for 2 pod(s) of "
            "cpu 1, nvidia.com/gpu 1: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
        )
    finally:
        b.finish()
    assert b.nodes == {f"rank-{i}": None for i in range(4)}  # given up when stopped


@pytest.mark.parametrize(
    "body, api",
    [
        (volcano_rank, "scheduling.volcano.sh/v1beta1"),
        (coscheduling_rank, "scheduling.x-k8s.io/v1alpha1"),
    ],
)
def test_a_podgroup_gang_waits_for_its_podgroup_then_its_min_member(body, api):
    """Without its PodGroup the pod waits (both schedulers leave it Pending); created with
    minMember 2, the two pods are bound together once both exist."""
    store = ObjectStore()
    b = Binder(Scheduler(cluster(node("gpu-0", gpus=2)), store))
    try:
        b.bind("rank-0", body())
        assert "PodGroup not found" in b.wait_pending("rank-0")
        store.create(podgroup(api, 2))
        deadline = time.time() + 5
        while "1 of its 2 pods exist" not in b.pending["rank-0"][-1] and time.time() < deadline:
            time.sleep(0.01)
        assert "1 of its 2 pods exist" in b.pending["rank-0"][-1]
        b.bind("rank-1", body())
        assert b.wait_bound("rank-0", "rank-1") == ["gpu-0", "gpu-0"]
    finally:
        b.finish()


def test_a_retried_rank_joins_its_running_gang_alone():
    """A rank retried while the rest of its gang runs is bound as soon as it fits (the gang's
    quorum is the pods already bound plus it), as coscheduling's Permit counts assigned pods."""
    sched = Scheduler(cluster(node("gpu-0", gpus=1), node("gpu-1", gpus=1)))
    b = Binder(sched)
    try:
        b.bind("rank-0", kueue_rank(2))
        b.bind("rank-1", kueue_rank(2))
        assert sorted(b.wait_bound("rank-0", "rank-1")) == ["gpu-0", "gpu-1"]
        sched.release("rank-1")  # its pod failed; Argo retries it
        b.bind("rank-1(1)", kueue_rank(2))
        assert b.wait_bound("rank-1(1)") == [b.nodes["rank-1"]]
    finally:
        b.finish()


def test_pods_of_no_gang_are_not_held_by_a_waiting_gang():
    """A gang that does not fit does not block a later pod that does (nothing is reserved)."""
    sched = Scheduler(cluster(node("gpu-0", gpus=1)))
    b = Binder(sched)
    try:
        b.bind("rank-0", kueue_rank(2))
        b.bind("rank-1", kueue_rank(2))
        b.wait_pending("rank-1")
        b.bind("light", {"container": {"resources": {"requests": {"cpu": "1"}}}})
        assert b.wait_bound("light") == ["gpu-0"]
        assert "rank-0" not in b.nodes
    finally:
        b.finish()

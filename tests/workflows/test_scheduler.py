"""The local kube-scheduler (runner/placement.py, scheduler.py): each filter, the FitError
message, binding."""

from __future__ import annotations

import threading
import time

import pytest
from ckptflow.workflows.runner.cluster import Cluster, ClusterNode
from ckptflow.workflows.runner.placement import (
    fit_error,
    fit_resources,
    match_node_affinity,
    place,
    pod_request,
    untolerated_taint,
)
from ckptflow.workflows.runner.scheduler import Scheduler

GPU = "nvidia.com/gpu"


def node(name, cpu=4, memory=8 << 30, labels=None, taints=(), **extra) -> ClusterNode:
    alloc = {"cpu": cpu * 1000, "memory": memory, "pods": 110, **extra}
    return ClusterNode(
        name, {"kubernetes.io/hostname": name, **(labels or {})}, tuple(taints), alloc
    )


def gpu_node(name="gpu-0", gpus=1) -> ClusterNode:
    taint = {"key": GPU, "value": "", "effect": "NoSchedule"}
    return node(name, labels={"pool": "gpu"}, taints=[taint], **{GPU: gpus})


def pod(requests=None, limits=None, **spec) -> dict:
    res = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    return {"container": {"image": "x", "resources": res}, **spec}


def cluster(*nodes) -> Cluster:
    return Cluster(tuple(nodes), "test", frozenset(n.name for n in nodes))


def test_fit_resources_fits_and_insufficient():
    p = pod_request("p", pod({"cpu": "2", "memory": "1Gi"}))
    assert fit_resources(p, node("a"), {}) == []
    assert fit_resources(p, node("a", cpu=1), {}) == ["Insufficient cpu"]
    assert fit_resources(p, node("a"), {"cpu": 3000}) == ["Insufficient cpu"]
    big = pod_request("p", pod({"cpu": "8", "memory": "16Gi"}))
    assert fit_resources(big, node("a"), {}) == ["Insufficient cpu", "Insufficient memory"]


def test_extended_resource_the_node_lacks_is_insufficient():
    p = pod_request("p", pod(limits={GPU: 1}))  # a limit alone is the request
    assert p.requests == {GPU: 1}
    assert fit_resources(p, node("cpu-0"), {}) == [f"Insufficient {GPU}"]
    assert fit_resources(p, gpu_node(), {}) == []
    assert fit_resources(p, gpu_node(), {GPU: 1}) == [f"Insufficient {GPU}"]


def test_too_many_pods():
    p = pod_request("p", pod())
    assert fit_resources(p, node("a"), {"pods": 110}) == ["Too many pods"]


def test_taint_without_toleration_is_named():
    p = pod_request("p", pod())
    assert untolerated_taint(p, gpu_node()) == f"node(s) had untolerated taint {{{GPU}: }}"
    soft = node("s", taints=[{"key": "k", "value": "v", "effect": "PreferNoSchedule"}])
    assert untolerated_taint(p, soft) is None


@pytest.mark.parametrize(
    "toleration, ok",
    [
        ({"key": GPU, "operator": "Exists", "effect": "NoSchedule"}, True),
        ({"key": GPU, "operator": "Exists"}, True),
        ({"operator": "Exists"}, True),
        ({"key": GPU, "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": GPU, "value": "", "effect": "NoSchedule"}, True),
        ({"key": GPU, "value": "yes", "effect": "NoSchedule"}, False),
        ({"key": "other", "operator": "Exists"}, False),
    ],
)
def test_toleration(toleration, ok):
    p = pod_request("p", pod(tolerations=[toleration]))
    assert (untolerated_taint(p, gpu_node()) is None) is ok


def test_node_selector():
    on_gpu = pod_request("p", pod(nodeSelector={"pool": "gpu"}))
    assert match_node_affinity(on_gpu, gpu_node()) is None
    assert match_node_affinity(on_gpu, node("cpu-0")) == (
        "node(s) didn't match Pod's node affinity/selector"
    )


def _affinity(*exprs, fields=()) -> dict:
    term = {"matchExpressions": list(exprs)}
    if fields:
        term["matchFields"] = list(fields)
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }


def test_required_node_affinity_and_anti_affinity():
    anti = pod_request(
        "p",
        pod(
            affinity=_affinity(
                {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["a"]}
            )
        ),
    )
    assert match_node_affinity(anti, node("a")) is not None
    assert match_node_affinity(anti, node("b")) is None
    exists = pod_request("p", pod(affinity=_affinity({"key": "pool", "operator": "Exists"})))
    assert match_node_affinity(exists, gpu_node()) is None
    assert match_node_affinity(exists, node("a")) is not None
    gt = pod_request(
        "p", pod(affinity=_affinity({"key": "gen", "operator": "Gt", "values": ["3"]}))
    )
    assert match_node_affinity(gt, node("a", labels={"gen": "4"})) is None
    assert match_node_affinity(gt, node("a", labels={"gen": "3"})) is not None
    by_name = pod_request(
        "p",
        pod(
            affinity=_affinity(fields=[{"key": "metadata.name", "operator": "In", "values": ["b"]}])
        ),
    )
    assert [match_node_affinity(by_name, node(n)) is None for n in "ab"] == [False, True]


def test_workflow_level_placement_unless_the_template_has_its_own():
    spec = {"nodeSelector": {"pool": "gpu"}}
    assert pod_request("p", pod(), spec).node_selector == {"pool": "gpu"}
    assert pod_request("p", pod(nodeSelector={"pool": "cpu"}), spec).node_selector == {
        "pool": "cpu"
    }


def test_unreadable_pods_are_one_line_errors():
    with pytest.raises(ValueError, match="resources.requests.cpu"):
        pod_request("p", pod({"cpu": "lots"}))
    required = {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "x"}]}
    with pytest.raises(ValueError, match="podAntiAffinity"):
        pod_request("p", pod(affinity={"podAntiAffinity": required}))


def test_fit_error_message_format():
    """framework/types.go: count + reason, sorted as strings, joined by ', ', then '.'."""
    c = cluster(node("cpu-0", cpu=1), gpu_node())
    where, message = place(c, pod_request("p", pod({"cpu": "2"})), {})
    assert where is None
    assert message == (
        f"0/2 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint {{{GPU}: }}."
    )
    assert fit_error(3, {"a": ["Insufficient cpu"], "b": ["Insufficient cpu"], "c": ["X"]}) == (
        "0/3 nodes are available: 1 X, 2 Insufficient cpu."
    )


def test_first_node_in_profile_order_that_passes():
    c = cluster(node("a", cpu=1), node("b"), node("c"))
    assert place(c, pod_request("p", pod({"cpu": "2"})), {}) == ("b", "")
    assert place(c, pod_request("p", pod({"cpu": "2"})), {"b": {"cpu": 3000}}) == ("c", "")


def test_the_only_gpu_is_held_until_released():
    """Two pods each needing the only GPU: the second waits Pending until the first ends."""
    sched = Scheduler(cluster(node("cpu-0"), gpu_node()))
    needs = pod_request("p", pod(limits={GPU: 1}, tolerations=[{"key": GPU, "operator": "Exists"}]))
    assert sched.bind("a", needs, lambda: False, print) == "gpu-0"
    assert sched.used("gpu-0") == {GPU: 1, "pods": 1}
    seen, got = [], []
    t = threading.Thread(
        target=lambda: got.append(sched.bind("b", needs, lambda: False, seen.append))
    )
    t.start()
    deadline = time.time() + 5
    while not seen and time.time() < deadline:
        time.sleep(0.01)
    # the pod tolerates the GPU taint; cpu-0 has no GPU, gpu-0's one is in use
    assert seen == ["Unschedulable: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu."]
    assert got == []
    sched.release("a")
    t.join(5)
    assert got == ["gpu-0"]
    sched.release("b")
    assert sched.used("gpu-0") == {GPU: 0, "pods": 0}


def test_a_waiting_pod_gives_up_when_stopped():
    sched = Scheduler(cluster(node("a", cpu=1)))
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    assert sched.bind("p", pod_request("p", pod({"cpu": "2"})), stop.is_set, lambda m: None) is None
    assert sched.used("a") == {}

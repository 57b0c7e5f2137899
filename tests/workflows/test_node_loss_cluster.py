"""Issue 33, done-when: the rendered pretraining pipeline on a 4-node cluster profile (one CPU
node, three tainted one-GPU nodes) with a rank pod killed mid-training ends Succeeded.

The ranks reach the GPU nodes through the platform settings (gpu_node_selector,
gpu_tolerations, one nvidia.com/gpu each); the light steps keep to the CPU node
(platform.node_selector, and they tolerate no taint). The pods run on this CPU; the scheduler
(runner/scheduler.py) only binds them. The default one-node model is covered by
test_node_loss.py::test_a_rank_pod_killed_mid_training_resumes_and_succeeds.
"""

from __future__ import annotations

import itertools
import re

import pytest
from ckptflow.workflows.runner.cluster import load_profile
from ckptflow.workflows.runner.pods import available

from tests.workflows.isolated import run_isolated
from tests.workflows.test_node_loss import (
    BASE,
    Killer,
    _attempt_logs,
    _attempts,
    _committed_in,
    _is_rank,
    _log,
)

WHY = available()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"pods unavailable: {WHY}")
GPU_NODES = ("gpu-0", "gpu-1", "gpu-2")
PROFILE = """\
nodes:
- name: cpu-0
  labels: {pool: cpu}
  allocatable: {cpu: "4", memory: 16Gi}
""" + "".join(
    f"""\
- name: {name}
  labels: {{pool: gpu, nvidia.com/gpu.product: H100}}
  taints: [{{key: nvidia.com/gpu, effect: NoSchedule}}]
  allocatable: {{cpu: "2", memory: 8Gi, nvidia.com/gpu: "1"}}
"""
    for name in GPU_NODES
)
ON_GPU_NODES = [
    "platform.node_selector=pool=cpu",
    "platform.gpu_node_selector=pool=gpu",
    "platform.gpu_tolerations=nvidia.com/gpu:NoSchedule",
    "pretrain.rank_resources.gpu=1",
]


def _pods(result) -> list[dict]:
    return [n for n in result.nodes.values() if n["type"] == "Pod"]


def _rank(pod: dict) -> str:
    return re.match(r"rank\((\d+):", pod["displayName"]).group(1)


def _first_fit(rank_pods: list[dict], pod: dict, elsewhere: bool) -> str:
    """The node the scheduler's filters give `pod`: the first GPU node in profile order whose
    one GPU no other rank pod holds when it starts (runner/scheduler.py `place`) and, with
    retry_elsewhere, where no earlier attempt of its rank failed (the retry's required
    node anti-affinity, retry_tweak.go)."""
    start = pod["local"]["startedAtUnix"]
    held = {
        p["hostNodeName"]
        for p in rank_pods
        if p is not pod
        and p["local"]["startedAtUnix"] <= start < (p["local"].get("finishedAtUnix") or 1e12)
    }
    failed = {
        p["hostNodeName"]
        for p in rank_pods
        if elsewhere
        and _rank(p) == _rank(pod)
        and p["local"]["startedAtUnix"] < start
        and p["phase"] != "Succeeded"
    }
    return next(n for n in GPU_NODES if n not in held | failed)


@pytest.mark.timeout(480)
@pytest.mark.parametrize("elsewhere", [False, True], ids=["default", "retry-elsewhere"])
def test_a_rank_killed_mid_run_on_a_four_node_cluster_resumes_and_succeeds(tmp_path, elsewhere):
    """Default: the retry may come back to the node its rank lost (no retry affinity, a
    cluster sized to the job still runs it). With pretrain.retry_elsewhere the retry avoids
    it and takes the spare GPU node."""
    profile = tmp_path / "cluster.yaml"
    profile.write_text(PROFILE)

    def killer_for(node):
        return Killer(node, _is_rank(1), lambda pod: "checkpoint 20 committed" in _log(pod))

    out = run_isolated(
        tmp_path,
        "loss-4n-elsewhere" if elsewhere else "loss-4n",  # the in-process S3 outlives a test
        [*BASE, *ON_GPU_NODES, f"pretrain.retry_elsewhere={str(elsewhere).lower()}"],
        side_for=killer_for,
        cluster=load_profile(str(profile)),
    )
    result, text = out.result, out.text
    assert len(out.side.killed) == 1, result.table
    assert result.phase == "Succeeded", result.table

    # Every pod is bound to a node of the profile, as the scheduler's filters allow: ranks on
    # GPU nodes (selector, toleration, one GPU each), everything else on the CPU node.
    pods = _pods(result)
    ranks = [p for p in pods if p["displayName"].startswith("rank(")]
    light = [p for p in pods if not p["displayName"].startswith("rank(")]
    assert ranks and light, result.table
    assert {p["hostNodeName"] for p in light} == {"cpu-0"}, [
        (p["displayName"], p.get("hostNodeName")) for p in light
    ]
    placed = [(p["displayName"], p["hostNodeName"], p["local"]["startedAtUnix"]) for p in ranks]
    # The first attempts arrive together (bound in thread order): the first two GPU nodes.
    first = [p for p in ranks if p["displayName"].endswith(")(0)")]
    assert sorted(p["hostNodeName"] for p in first) == ["gpu-0", "gpu-1"], placed
    for a, b in itertools.combinations(ranks, 2):  # one GPU a node: never two ranks at once
        la, lb = a["local"], b["local"]
        at_once = (
            la["startedAtUnix"] < lb["finishedAtUnix"]
            and lb["startedAtUnix"] < la["finishedAtUnix"]
        )
        assert not (at_once and a["hostNodeName"] == b["hostNodeName"]), placed
    for pod in ranks:  # a retry arrives alone: the first node that passes the filters then
        if pod not in first:
            assert pod["hostNodeName"] == _first_fit(ranks, pod, elsewhere), placed

    # The killed rank was retried as a new pod, and both ranks resumed from the latest
    # checkpoint committed before the kill.
    attempts = _attempts(result, 1)
    assert len(attempts) >= 2 and attempts[0]["phase"] in ("Failed", "Error"), result.table
    assert attempts[-1]["phase"] == "Succeeded", result.table
    assert len({n["podIP"] for n in attempts}) == len(attempts)
    if elsewhere:  # the spare node: rank 0 holds one GPU node, rank 1 failed on another
        assert attempts[-1]["hostNodeName"] not in {a["hostNodeName"] for a in attempts[:-1]}
    last_before = max(_committed_in(_attempt_logs(result, 1)[0]))
    logs = "".join(log for i in (0, 1) for log in _attempt_logs(result, i))
    resumed = re.findall(r"\[rank(\d)\] \S+ INFO resumed from step (\d+)", logs)
    assert sorted(resumed) == [("0", str(last_before)), ("1", str(last_before))], resumed
    assert "pretrain: 6 committed checkpoints" in text, text

"""The rendered pretraining workflow with gang-scheduled ranks (`platform.gang_scheduler`) on a
three-node cluster model, as `ckptflow run ... --isolate --cluster` runs it (root, slow: a minute
or two): the `podgroup` resource task applies the run's PodGroup, the ranks are bound together
on the rank nodes and train to the end."""

from __future__ import annotations

from pathlib import Path

import pytest
from ckptflow.workflows.runner.cluster import load_profile
from ckptflow.workflows.runner.pods import available

from tests.workflows.isolated import run_isolated

WHY = available()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(WHY is not None, reason=f"pods unavailable: {WHY}"),
]
# one node for the light pods, one per rank (pool=rank, tainted: only the ranks go there)
PROFILE = """\
nodes:
- name: cpu-0
  allocatable: {cpu: "2", memory: 8Gi}
- name: rank-0
  labels: {pool: rank}
  taints: [{key: ckptflow/rank, effect: NoSchedule}]
  allocatable: {cpu: "1", memory: 4Gi, pods: "1"}
- name: rank-1
  labels: {pool: rank}
  taints: [{key: ckptflow/rank, effect: NoSchedule}]
  allocatable: {cpu: "1", memory: 4Gi, pods: "1"}
"""
SMALL = [
    "pretrain.max_steps=4",
    "pretrain.ckpt_every=2",
    "pretrain.retries=0",
    "pretrain.rdzv_join_timeout_s=60",
    "pretrain.timeout=300",
    "platform.gpu_node_selector=pool=rank",
    "platform.gpu_tolerations=ckptflow/rank:NoSchedule",
]


@pytest.mark.parametrize("kind", ["volcano", "kueue"])
def test_gang_scheduled_ranks_train_on_their_nodes(tmp_path: Path, kind):
    profile = tmp_path / "cluster.yaml"
    profile.write_text(PROFILE)
    overrides = [*SMALL, f"platform.gang_scheduler={kind}"]
    out = run_isolated(tmp_path, f"gang-{kind}", overrides, cluster=load_profile(str(profile)))
    result = out.result
    assert result.phase == "Succeeded", result.table
    ranks = [n for n in result.nodes.values() if n["displayName"].startswith("rank(")]
    assert sorted(r["hostNodeName"] for r in ranks) == ["rank-0", "rank-1"]
    # bound in item order (the order the controller creates the pods), whichever rank's
    # thread asked the scheduler first: rank 0 on the first node
    placed = {r["displayName"]: r["hostNodeName"] for r in ranks}
    assert [placed[name] for name in sorted(placed)] == ["rank-0", "rank-1"], placed
    groups = [n for n in result.nodes.values() if n["displayName"] == "podgroup"]
    assert [g["phase"] for g in groups] == (["Succeeded"] if kind == "volcano" else [])
    assert "pretrain: 2 committed checkpoints" in out.text, out.text

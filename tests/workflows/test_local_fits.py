"""The local configuration's pods fit a small machine as one node (runner/scheduler.py binds by
request: a rank left Pending would hold its rendezvous until the join timeout)."""

from __future__ import annotations

from ckptflow.workflows.local import local_config
from ckptflow.workflows.render import manifests
from ckptflow.workflows.runner.cluster import Cluster, ClusterNode
from ckptflow.workflows.runner.placement import pod_request
from ckptflow.workflows.runner.scheduler import Scheduler


def test_every_pod_of_a_local_pipeline_fits_two_cpus_at_once(tmp_path):
    """4 ranks, the evaluator and every other pod template bound together on a 2-CPU node
    (this machine's size in CI)."""
    cfg = local_config(tmp_path, s3_endpoint=None, overrides=["pretrain.ranks=4"])
    (wf,) = [d for d in manifests("pipeline", cfg) if d.get("kind") == "Workflow"]
    spec = wf["spec"]
    node = ClusterNode(
        "k3d-0",
        {"kubernetes.io/hostname": "k3d-0"},
        (),
        {"cpu": 2000, "memory": 16 << 30, "pods": 110},
    )
    sched = Scheduler(Cluster((node,)))
    pods = [t for t in spec["templates"] if "container" in t or "script" in t]
    ranks = [t for t in pods if t["name"] == "pretrain-rank"]
    assert ranks
    for i, t in enumerate(pods + ranks * 3):
        assert (
            sched.bind(f"p{i}", pod_request(t["name"], t, spec), lambda: True, print) == "k3d-0"
        ), t["name"]

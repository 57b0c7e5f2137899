"""`ckptflow check` on gang-scheduled ranks (runner/cluster_check.py with the runner's own gang
rule, runner/gang.py): a gang larger than the cluster, a PodGroup missing or asking more pods
than the task makes, for each gang scheduler, on the manifests `ckptflow render` writes."""

from __future__ import annotations

import pytest
import yaml
from ckptflow.workflows.config import PipelineConfig, apply_overrides
from ckptflow.workflows.render import manifests, to_yaml
from ckptflow.workflows.runner.cluster import Cluster, ClusterNode
from ckptflow.workflows.runner.cluster_check import check_manifests

from ckptflow import check_cli

GPU = "nvidia.com/gpu"
GPU_RANKS = (
    "pretrain.rank_resources.gpu=1",
    "platform.gpu_tolerations=nvidia.com/gpu:NoSchedule",
)


def cluster(gpu_nodes: int) -> Cluster:
    def node(name, taints=(), **alloc):
        return ClusterNode(name, {"kubernetes.io/hostname": name}, taints, alloc)

    taint = ({"key": GPU, "value": "", "effect": "NoSchedule"},)
    gpus = tuple(
        node(f"gpu-{i}", taint, cpu=8000, memory=64 << 30, pods=110, **{GPU: 1})
        for i in range(gpu_nodes)
    )
    return Cluster((node("cpu-0", cpu=4000, memory=8 << 30, pods=110), *gpus))


def rendered(kind: str) -> list[dict]:
    cfg = apply_overrides(PipelineConfig(), (f"platform.gang_scheduler={kind}", *GPU_RANKS))
    return manifests("pretrain", cfg)


def check(docs, gpu_nodes: int, ranks: int) -> list[str]:
    """The gang lines (`task ...`); service accounts and PSS are other tests' business."""
    found = check_manifests(docs, cluster(gpu_nodes), ([], ""), "deploy/", {"ranks": str(ranks)})
    return [line for line in found if line.startswith("task ")]


@pytest.mark.parametrize("kind", ["kueue", "volcano", "coscheduling"])
def test_a_gang_larger_than_the_cluster_names_its_pod_group(kind):
    docs = rendered(kind)
    assert check(docs, gpu_nodes=4, ranks=4) == []
    (line,) = check(docs, gpu_nodes=3, ranks=4)
    assert line == (
        f"task rank: {kind} pod group ckptflow/{{{{workflow.name}}}} of 4 pretrain-rank pods "
        "must run together but the cluster holds 3 at once: 0/4 nodes are available: "
        "4 Insufficient nvidia.com/gpu."
    )


def podgroup_workflow(min_member: int, count: int, make_group: bool = True) -> dict:
    rank = {
        "name": "rank",
        "metadata": {"annotations": {"scheduling.k8s.io/group-name": "g"}},
        "schedulerName": "volcano",
        "container": {"image": "x", "resources": {"requests": {"cpu": "1"}}},
    }
    group = {
        "name": "group",
        "resource": {
            "action": "create",
            "manifest": "apiVersion: scheduling.volcano.sh/v1beta1\nkind: PodGroup\n"
            f"metadata:\n  name: g\nspec:\n  minMember: {min_member}\n",
        },
    }
    main = {
        "name": "main",
        "dag": {
            "tasks": [{"name": "ranks", "template": "rank", "withSequence": {"count": str(count)}}]
        },
    }
    templates = [main, rank, group] if make_group else [main, rank]
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "wf"},
        "spec": {"entrypoint": "main", "templates": templates},
    }


def test_min_member_above_the_task_s_pods_is_one_line():
    assert check([podgroup_workflow(2, 2)], 0, 1) == []
    assert check([podgroup_workflow(5, 4)], 0, 1) == [
        "task ranks: volcano pod group default/g needs 5 pods bound together but the task makes "
        "4 rank pods: none of them is ever bound"
    ]


def test_a_missing_podgroup_is_one_line():
    assert check([podgroup_workflow(2, 2, make_group=False)], 0, 1) == [
        "task ranks: volcano pod group default/g: PodGroup not found "
        "(scheduling.volcano.sh/v1beta1 PodGroup 'g'): the manifest does not create it, so its "
        "pods stay Pending"
    ]


def test_the_gang_counts_its_min_member_not_every_pod():
    """minMember 2 of 4 pods: only 2 must fit at once (the others may wait)."""
    assert check([podgroup_workflow(2, 4)], 0, 1) == []  # cpu-0 holds 4 one-CPU pods anyway
    doc = podgroup_workflow(2, 6)
    assert check([doc], 0, 1) == []  # 4 fit at once, 2 must
    doc = podgroup_workflow(5, 6)
    (line,) = check([doc], 0, 1)
    assert "of 5 rank pods must run together but the cluster holds 4 at once" in line


def test_cli_says_it_for_a_rendered_volcano_pipeline(tmp_path, capsys):
    manifest, profile = tmp_path / "p.yaml", tmp_path / "k3d.yaml"
    manifest.write_text(to_yaml(rendered("volcano")))
    profile.write_text(
        yaml.safe_dump(
            {
                "nodes": [
                    {"name": "cpu-0", "allocatable": {"cpu": "4", "memory": "8Gi"}},
                    {
                        "name": "gpu-0",
                        "taints": [{"key": GPU, "effect": "NoSchedule"}],
                        "allocatable": {"cpu": "8", "memory": "64Gi", GPU: "1"},
                    },
                ]
            }
        )
    )
    assert check_cli.main([str(manifest), "--cluster", str(profile), "-p", "ranks=1"]) == 0
    capsys.readouterr()
    assert check_cli.main([str(manifest), "--cluster", str(profile), "-p", "ranks=2"]) == 1
    out = capsys.readouterr().out
    assert "volcano pod group ckptflow/{{workflow.name}} of 2 pretrain-rank pods" in out

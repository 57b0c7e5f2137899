"""`ckptflow run FILE --isolate --cluster PROFILE` with gang-scheduled ranks (root): the local
cluster model binds a gang's pods all or nothing (runner/gang.py, runner/scheduler.py).

Profile: a CPU node and two tainted one-GPU nodes; each rank requests one GPU. Two ranks fit and
are bound together (Kueue's total count, or a Volcano / coscheduling PodGroup a resource
template creates first); three never fit: none is bound, and at the workflow's deadline each fails with one line
naming the gang and the capacity missing.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from ckptflow.workflows.runner import run_workflow
from ckptflow.workflows.runner.cluster import load_profile
from ckptflow.workflows.runner.pods import available

WHY = available()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"pods unavailable: {WHY}")
GPU = "nvidia.com/gpu"
PROFILE = """\
nodes:
- name: cpu-0
  allocatable: {cpu: "2", memory: 4Gi}
- name: gpu-0
  taints: [{key: nvidia.com/gpu, effect: NoSchedule}]
  allocatable: {cpu: "2", memory: 4Gi, nvidia.com/gpu: "1"}
- name: gpu-1
  taints: [{key: nvidia.com/gpu, effect: NoSchedule}]
  allocatable: {cpu: "2", memory: 4Gi, nvidia.com/gpu: "1"}
"""
NODE_ENV = [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
RANKS = "{{workflow.parameters.ranks}}"
MARKINGS = {
    "kueue": {
        "metadata": {
            "labels": {
                "kueue.x-k8s.io/queue-name": "ckptflow",
                "kueue.x-k8s.io/pod-group-name": "{{workflow.name}}",
            },
            "annotations": {"kueue.x-k8s.io/pod-group-total-count": RANKS},
        }
    },
    "volcano": {
        "metadata": {"annotations": {"scheduling.k8s.io/group-name": "{{workflow.name}}"}},
        "schedulerName": "volcano",
    },
    "coscheduling": {
        "metadata": {"labels": {"scheduling.x-k8s.io/pod-group": "{{workflow.name}}"}},
        "schedulerName": "scheduler-plugins-scheduler",
    },
}
API = {"volcano": "scheduling.volcano.sh/v1beta1", "coscheduling": "scheduling.x-k8s.io/v1alpha1"}
PODGROUP = f"""\
apiVersion: API
kind: PodGroup
metadata:
  name: "{{{{workflow.name}}}}"
spec:
  minMember: {RANKS}
"""


def gang_workflow(
    name: str, kind: str, ranks: int, deadline: int | None = None, min_member: str = RANKS
) -> dict:
    rank = {
        "name": "rank",
        "container": {
            "image": "x",
            "command": ["python", "-c", "import os; print(os.environ['NODE'])"],
            "env": NODE_ENV,
            "resources": {"limits": {GPU: 1}},
        },
        "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
        **MARKINGS[kind],
    }
    tasks = [{"name": "rank", "template": "rank", "withSequence": {"count": RANKS}}]
    templates = [rank]
    if kind in API:  # its PodGroup first, owned by the workflow (gang_scheduling.py)
        templates.append(
            {
                "name": "podgroup",
                "resource": {
                    "action": "apply",
                    "manifest": PODGROUP.replace(RANKS, min_member).replace("API", API[kind]),
                    "setOwnerReference": True,
                },
            }
        )
        tasks = [{"name": "podgroup", "template": "podgroup"}, {**tasks[0], "depends": "podgroup"}]
    spec = {
        "entrypoint": "main",
        "arguments": {"parameters": [{"name": "ranks", "value": str(ranks)}]},
        "templates": [{"name": "main", "dag": {"tasks": tasks}}, *templates],
    }
    if deadline:
        spec["activeDeadlineSeconds"] = deadline
    return {"metadata": {"name": name}, "spec": spec}


@pytest.fixture
def cluster(tmp_path: Path):
    path = tmp_path / "cluster.yaml"
    path.write_text(PROFILE)
    return load_profile(str(path))


def run(tmp_path, cluster, manifest):
    name = manifest["metadata"]["name"]
    return run_workflow(
        manifest,
        workdir=str(tmp_path / name),
        name=name,
        stream=io.StringIO(),
        isolate=True,
        cluster=cluster,
    )


def ranks_of(result) -> list[dict]:
    nodes = result.status["status"]["nodes"].values()
    return sorted(
        (n for n in nodes if n.get("templateName") == "rank" and n["type"] == "Pod"),
        key=lambda n: n["displayName"],
    )


@pytest.mark.parametrize("kind", ["kueue", "volcano", "coscheduling"])
def test_a_gang_that_fits_is_bound_together(tmp_path, cluster, kind):
    # a deadline so that a gang never admitted fails the test instead of hanging it
    result = run(tmp_path, cluster, gang_workflow(f"gang-{kind}", kind, ranks=2, deadline=60))
    assert result.phase == "Succeeded", result.message
    ranks = ranks_of(result)
    assert len(ranks) == 2
    assert sorted(r["hostNodeName"] for r in ranks) == ["gpu-0", "gpu-1"]
    assert sorted(r["outputs"]["result"] for r in ranks) == ["gpu-0", "gpu-1"]


@pytest.mark.parametrize("kind", ["kueue", "volcano"])
def test_a_gang_that_never_fits_binds_nothing_and_fails_at_the_deadline(tmp_path, cluster, kind):
    name = f"never-{kind}"
    result = run(tmp_path, cluster, gang_workflow(name, kind, ranks=3, deadline=3))
    assert result.phase == "Failed"
    ranks = ranks_of(result)
    assert len(ranks) == 3
    assert all("hostNodeName" not in r for r in ranks)  # two would fit: none was bound
    messages = {r["message"] for r in ranks}
    assert messages == {
        f"Step exceeded its deadline: Unschedulable: {kind} pod group default/{name}: 3 pods "
        "must be bound together, 2 fit now; it never fits: the empty cluster holds 2; missing "
        "capacity for 1 pod(s) of nvidia.com/gpu 1: 0/3 nodes are available: 3 Insufficient "
        "nvidia.com/gpu."
    }


def test_a_podgroup_s_min_member_is_read_from_the_object_store(tmp_path, cluster):
    """Three ranks, minMember 2 (the PodGroup the resource task created): two are bound
    together on the two GPUs, the third once one of them ends; all succeed."""
    manifest = gang_workflow("gang-min", "volcano", ranks=3, deadline=60, min_member="2")
    result = run(tmp_path, cluster, manifest)
    assert result.phase == "Succeeded", result.message
    ranks = ranks_of(result)
    assert {r["hostNodeName"] for r in ranks} == {"gpu-0", "gpu-1"}
    first = sorted(ranks, key=lambda r: r["local"]["startedAtUnix"])
    assert first[2]["local"]["startedAtUnix"] >= min(
        r["local"]["finishedAtUnix"] for r in first[:2]
    )


def test_a_podgroup_without_a_namespace_is_made_in_the_workflow_s(tmp_path, cluster):
    """kubectl in Argo's executor pod creates a manifest without a namespace in the pod's own,
    the workflow's: the ranks of a workflow in `team-a` find their PodGroup there."""
    manifest = gang_workflow("gang-ns", "volcano", ranks=2, deadline=10)
    manifest["metadata"]["namespace"] = "team-a"
    result = run(tmp_path, cluster, manifest)
    assert result.phase == "Succeeded", [r.get("message") for r in ranks_of(result)]

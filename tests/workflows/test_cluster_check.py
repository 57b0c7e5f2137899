"""`ckptflow check` (runner/cluster_check.py, runner/pss.py, ckptflow/check_cli.py): what would
hang or be rejected on a cluster, one line each, on good and bad manifests."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from ckptflow.workflows.runner.cluster import Cluster, ClusterNode
from ckptflow.workflows.runner.cluster_check import check_manifests, deploy_objects
from ckptflow.workflows.runner.pss import restricted_violations

from ckptflow import check_cli

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "workflows" / "golden"
GPU = "nvidia.com/gpu"
SAFE = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
PROFILE = """\
nodes:
- name: cpu-0
  allocatable: {cpu: "4", memory: 8Gi}
- name: gpu-0
  labels: {pool: gpu}
  taints: [{key: nvidia.com/gpu, effect: NoSchedule}]
  allocatable: {cpu: "8", memory: 64Gi, nvidia.com/gpu: "1"}
"""


def two_nodes() -> Cluster:
    def node(name, labels=None, taints=(), **alloc):
        return ClusterNode(name, {"kubernetes.io/hostname": name, **(labels or {})}, taints, alloc)

    taint = ({"key": GPU, "value": "", "effect": "NoSchedule"},)
    return Cluster(
        (
            node("cpu-0", cpu=4000, memory=8 << 30, pods=110),
            node("gpu-0", {"pool": "gpu"}, taint, cpu=8000, memory=64 << 30, pods=110, **{GPU: 1}),
        )
    )


def template(name="t", **extra) -> dict:
    container = {"image": "x", "command": ["python"], "securityContext": dict(SAFE)}
    container.update(extra.pop("container", {}))
    return {"name": name, "container": container, **extra}


def workflow(*templates, **spec) -> dict:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "wf"},
        "spec": {"entrypoint": templates[0]["name"], "templates": list(templates), **spec},
    }


def check(*docs, params=None) -> list[str]:
    return check_manifests(list(docs), two_nodes(), ([], ""), "deploy/", params)


def test_a_good_workflow_has_no_problem():
    gpu = template(
        "train",
        container={"resources": {"limits": {GPU: 1, "memory": "4Gi"}}},
        tolerations=[{"key": GPU, "operator": "Exists"}],
    )
    assert check(workflow(template(), gpu)) == []


def test_a_pod_that_fits_no_node():
    big = template(container={"resources": {"requests": {"cpu": "16"}}})
    assert check(workflow(big)) == [
        "template t: its pod fits no node: 0/2 nodes are available: 1 Insufficient cpu, "
        "1 node(s) had untolerated taint {nvidia.com/gpu: }."
    ]
    on_gpu = template(nodeSelector={"pool": "gpu"})  # the GPU pool without the toleration
    assert check(workflow(on_gpu)) == [
        "template t: its pod fits no node: 0/2 nodes are available: 1 node(s) didn't match Pod's "
        "node affinity/selector, 1 node(s) had untolerated taint {nvidia.com/gpu: }."
    ]


def test_parameters_are_their_defaults_unless_given():
    cpu = template(container={"resources": {"requests": {"cpu": "{{workflow.parameters.cpu}}"}}})
    wf = workflow(cpu, arguments={"parameters": [{"name": "cpu", "value": "2"}]})
    assert check(wf) == []
    assert len(check(wf, params={"cpu": "9"})) == 1


def test_a_gang_larger_than_the_cluster():
    rank = template(
        "rank",
        container={"args": ["--nnodes=3"], "resources": {"requests": {"cpu": "3"}}},
    )
    dag = {
        "name": "main",
        "dag": {
            "tasks": [
                {
                    "name": "ranks",
                    "template": "rank",
                    "withSequence": {"count": "{{workflow.parameters.n}}"},
                }
            ]
        },
    }
    wf = workflow(dag, rank, arguments={"parameters": [{"name": "n", "value": "1"}]})
    assert check(wf) == []
    (line,) = check(wf, params={"n": "2"})
    assert line.startswith(
        "task ranks: a gang of 2 rank pods must run together but the cluster holds 1"
    )


def test_a_retry_that_can_never_be_scheduled():
    retry = {"limit": 2, "affinity": {"nodeAntiAffinity": {}}}
    (line,) = check(workflow(template(retryStrategy=retry)))
    assert "needs 3 nodes for its attempts but 1 fit the pod: retry 1 would stay Pending" in line
    tolerant = template(retryStrategy={**retry, "limit": 1}, tolerations=[{"operator": "Exists"}])
    assert check(workflow(tolerant)) == []  # two nodes fit it: one retry elsewhere


def test_shm_above_the_memory_limit():
    shm = template(
        container={
            "resources": {"limits": {"memory": "512Mi"}},
            "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        },
        volumes=[{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
    )
    (line,) = check(workflow(shm))
    assert line.startswith("template t: emptyDir 'dshm' at /dev/shm (medium Memory, sizeLimit 1Gi)")
    ok = copy.deepcopy(shm)
    ok["volumes"][0]["emptyDir"]["sizeLimit"] = "256Mi"
    assert check(workflow(ok)) == []


def test_restricted_pod_security_violations():
    bare = {"name": "t", "container": {"image": "x"}}
    assert restricted_violations(bare, {}) == [
        'allowPrivilegeEscalation != false (container "main" must set '
        "securityContext.allowPrivilegeEscalation=false)",
        'runAsNonRoot != true (pod or container "main" must set securityContext.runAsNonRoot=true)',
        'seccompProfile (pod or container "main" must set securityContext.seccompProfile.type to '
        '"RuntimeDefault" or "Localhost")',
        'unrestricted capabilities (container "main" must set securityContext.capabilities.drop=["ALL"])',
    ]
    # pod-level runAsNonRoot and seccomp cover the containers (the template's securityContext)
    pod_level = {
        "name": "t",
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "container": {
            "image": "x",
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            },
        },
    }
    assert restricted_violations(pod_level, {}) == []
    host = template(
        hostNetwork=True,
        container={
            "securityContext": {**SAFE, "privileged": True},
            "volumeMounts": [{"name": "h", "mountPath": "/h"}],
        },
        volumes=[{"name": "h", "hostPath": {"path": "/"}}],
    )
    assert [v.split(" (")[0] for v in restricted_violations(host, {})] == [
        "host namespaces",
        "privileged",
        "hostPath volumes",
    ]
    (line,) = check(workflow(host))
    assert line.startswith('template t: violates PodSecurity "restricted:latest": host namespaces')


def test_sensor_and_service_accounts_deploy_does_not_create():
    sensor = {
        "kind": "Sensor",
        "metadata": {"name": "s"},
        "spec": {"template": {"serviceAccountName": "sa"}},
    }
    wf = workflow(template(), serviceAccountName="runner")
    assert check(sensor, wf) == [
        "Sensor s: deploy/ does not install Argo Events (the Sensor kind)",
        "Sensor s: EventBus 'default' is not created by deploy/",
        "Sensor s: service account 'sa' is not created by deploy/",
        "Workflow wf: service account 'runner' is not created by deploy/",
    ]
    objects = [{"kind": "ServiceAccount", "metadata": {"name": n}} for n in ("sa", "runner")] + [
        {"kind": "EventBus", "metadata": {"name": "default"}}
    ]
    deploy = (
        objects,
        "https://github.com/argoproj/argo-events/releases/download/v1.9.6/install.yaml",
    )
    assert check_manifests([sensor, wf], two_nodes(), deploy) == []


def test_the_repository_deploy_creates_the_workflow_account():
    objects, _ = deploy_objects(str(REPO / "deploy"))
    wf = workflow(template(), serviceAccountName="ckptflow-workflow")
    assert check_manifests([wf], two_nodes(), (objects, "")) == []


def test_cli_exit_codes(tmp_path, capsys):
    profile = tmp_path / "cluster.yaml"
    profile.write_text(PROFILE)
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(yaml.safe_dump(workflow(template())))
    big = template(container={"resources": {"requests": {"cpu": "16"}}})
    bad.write_text(yaml.safe_dump_all([workflow(big), workflow(template("u", hostNetwork=True))]))
    assert check_cli.main(["--cluster", str(profile), str(good)]) == 0
    assert "ok: nothing would hang or be rejected" in capsys.readouterr().out
    assert check_cli.main(["--cluster", str(profile), str(bad)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("template t: its pod fits no node: 0/2 nodes are available")
    assert out[1].startswith(
        'template u: violates PodSecurity "restricted:latest": host namespaces'
    )
    assert check_cli.main(["--cluster", str(tmp_path / "none.yaml"), str(good)]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["pipeline", "pretrain", "finetune", "retention"])
def test_the_golden_manifests_pass_on_a_one_node_cluster(name, tmp_path, capsys):
    """The rendered manifests run on one k3d node of a small machine as deploy/ sets it up."""
    profile = tmp_path / "k3d.yaml"
    profile.write_text("nodes: [{name: k3d-0, allocatable: {cpu: '2', memory: 8Gi}}]")
    argv = [
        str(GOLDEN / f"{name}.yaml"),
        "--cluster",
        str(profile),
        "--deploy",
        str(REPO / "deploy"),
    ]
    assert check_cli.main(argv) == 0, capsys.readouterr().out


def test_host_network_set_by_pod_spec_patch_is_judged():
    patched = template(podSpecPatch='{"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet"}')
    assert [v.split(" (")[0] for v in restricted_violations(patched, {})] == ["host namespaces"]
    unresolved = template(podSpecPatch="{{workflow.parameters.patch}}")
    assert restricted_violations(unresolved, {}) == []

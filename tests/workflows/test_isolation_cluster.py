"""`ckptflow run FILE --isolate --cluster PROFILE`: pods bound to the profile's nodes (root).

A two-node profile (a CPU node, a tainted GPU node with one `nvidia.com/gpu`): each pod's
`hostNodeName` is where the scheduler put it, pods needing the only GPU run one after the other,
and a pod that fits nowhere stays Pending with the scheduler's message until its deadline.
"""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

import pytest
from ckptflow.workflows.runner import run_workflow
from ckptflow.workflows.runner.cluster import load_profile
from ckptflow.workflows.runner.pods import available

from ckptflow import run_cli

WHY = available()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"pods unavailable: {WHY}")
GPU = "nvidia.com/gpu"
PROFILE = """\
nodes:
- name: cpu-0
  labels: {pool: cpu}
  allocatable: {cpu: "2", memory: 4Gi}
- name: gpu-0
  labels: {pool: gpu}
  taints: [{key: nvidia.com/gpu, effect: NoSchedule}]
  allocatable: {cpu: "2", memory: 4Gi, nvidia.com/gpu: "1"}
"""
TOLERATE = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
NODE_ENV = [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]


def task(name: str, seconds: float = 0.0, **pod) -> dict:
    """A template printing the node it runs on after `seconds`, with `pod` fields."""
    script = f"import os, time; time.sleep({seconds}); print(os.environ['NODE'])"
    container = {"image": "x", "command": ["python", "-c", script], "env": NODE_ENV}
    if "resources" in pod:
        container["resources"] = pod.pop("resources")
    return {"name": name, "container": container, **pod}


def workflow(name: str, templates: list[dict]) -> dict:
    tasks = [{"name": t["name"], "template": t["name"]} for t in templates]
    return {
        "metadata": {"name": name},
        "spec": {
            "entrypoint": "main",
            "templates": [{"name": "main", "dag": {"tasks": tasks}}, *templates],
        },
    }


@pytest.fixture
def profile(tmp_path: Path) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(PROFILE)
    return str(path)


def test_pods_are_bound_and_the_only_gpu_is_taken_in_turn(tmp_path, profile):
    gpu = {"resources": {"limits": {GPU: 1}}, "tolerations": TOLERATE}
    manifest = workflow(
        "bind",
        [
            task("light", nodeSelector={"pool": "cpu"}),
            task("train-a", 1.0, **gpu),
            task("train-b", 1.0, **gpu),
        ],
    )
    result = run_workflow(
        manifest,
        workdir=str(tmp_path / "w"),
        name="bind",
        stream=io.StringIO(),
        isolate=True,
        cluster=load_profile(profile),
    )
    assert result.phase == "Succeeded", result.message
    nodes = {n: result.node(n) for n in ("light", "train-a", "train-b")}
    assert {n: s["hostNodeName"] for n, s in nodes.items()} == {
        "light": "cpu-0",
        "train-a": "gpu-0",
        "train-b": "gpu-0",
    }
    assert nodes["light"]["outputs"]["result"] == "cpu-0"  # spec.nodeName in the pod
    a, b = sorted(
        (nodes[n]["local"]["startedAtUnix"], nodes[n]["local"]["finishedAtUnix"])
        for n in ("train-a", "train-b")
    )
    assert b[0] >= a[1]  # the second GPU pod started after the first ended


def test_a_pod_that_fits_nowhere_is_pending_until_its_deadline(tmp_path, profile, capsys):
    manifest = workflow(
        "pending",
        [task("huge", resources={"requests": {"cpu": "3"}}, timeout="3s")],
    )  # a template timeout counts Pending time (operator.go checkTemplateTimeouts)
    path = tmp_path / "pending.yaml"
    path.write_text(json.dumps(manifest))
    status = tmp_path / "w" / "status.json"
    seen: list[dict] = []

    def watch():
        deadline = time.time() + 10
        while time.time() < deadline and not seen:
            try:
                node = json.loads(status.read_text())["status"]["nodes"]
            except (OSError, ValueError, KeyError):
                time.sleep(0.05)
                continue
            seen.extend(n for n in node.values() if n["displayName"] == "huge" and n.get("message"))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    argv = [str(path), "--isolate", "--cluster", profile, "--workdir", str(tmp_path / "w")]
    rc = run_cli.main(argv)
    watcher.join()
    assert rc == 1
    assert seen and seen[0]["phase"] == "Pending"
    assert seen[0]["message"] == (
        "Unschedulable: 0/2 nodes are available: 1 Insufficient cpu, "
        "1 node(s) had untolerated taint {nvidia.com/gpu: }."
    )
    final = json.loads(status.read_text())["status"]["nodes"]
    huge = next(n for n in final.values() if n["displayName"] == "huge")
    assert huge["phase"] == "Failed" and "hostNodeName" not in huge


def test_cluster_needs_isolate_and_a_valid_profile(tmp_path, profile, capsys):
    path = tmp_path / "wf.yaml"
    path.write_text(json.dumps(workflow("w", [task("t")])))
    assert run_cli.main([str(path), "--cluster", profile]) == 2
    assert "add --isolate" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [{name: a}]")
    assert run_cli.main([str(path), "--isolate", "--cluster", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"ckptflow run: {bad}: nodes[0].allocatable") and "\n" not in err


def test_a_pending_pod_is_not_ended_by_its_own_active_deadline(tmp_path, profile):
    """Kubernetes counts a pod's activeDeadlineSeconds from its startTime, set once the kubelet
    admits it on a node (pkg/kubelet/active_deadline.go): a pod that fits nowhere is ended by
    the workflow's deadline ("Step exceeded its deadline"), not by its own 1 s."""
    manifest = workflow(
        "pend-own",
        [task("huge", resources={"requests": {"cpu": "3"}}, activeDeadlineSeconds=1)],
    )
    manifest["spec"]["activeDeadlineSeconds"] = 3
    started = time.monotonic()
    result = run_workflow(
        manifest,
        workdir=str(tmp_path / "w"),
        name="pend-own",
        stream=io.StringIO(),
        isolate=True,
        cluster=load_profile(profile),
    )
    huge = result.node("huge")
    assert huge["phase"] == "Failed"
    assert huge["message"] == "Step exceeded its deadline"
    assert "hostNodeName" not in huge
    assert time.monotonic() - started >= 2.5  # the workflow's 3 s, not the pod's 1 s

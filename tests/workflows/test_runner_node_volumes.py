"""Volumes of simulated nodes under `--isolate` (workflows/runner/volumes.py, isolation.py):

- a hostPath is a directory of the pod's node (`<workdir>/nodes/<node>/host/<path>`): two nodes
  never share it, a pod retried on the same node finds what the earlier pod left, a pod on
  another node does not, and this machine's own path is never touched;
- an emptyDir is the pod's own: a retried pod (a new pod) starts with an empty one;
- Kubernetes' hostPath rules (absolute, no `..`) are checked before anything runs.
"""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest
from ckptflow.workflows.runner import isolation, run_workflow, volumes
from ckptflow.workflows.runner.cluster import load_profile
from ckptflow.workflows.runner.pods import Volume, available

WHY = available()
needs_pods = pytest.mark.skipif(WHY is not None, reason=f"pods unavailable: {WHY}")
PROFILE = """\
nodes:
- name: node-a
  allocatable: {cpu: "2", memory: 4Gi}
- name: node-b
  allocatable: {cpu: "2", memory: 4Gi}
"""


def _run(tmp_path: Path, vols: list[dict]) -> SimpleNamespace:
    return SimpleNamespace(spec={"volumes": vols}, workdir=str(tmp_path / "w"))


def _body(mount: str = "/h") -> dict:
    return {"container": {"volumeMounts": [{"name": "h", "mountPath": mount}]}}


def test_a_host_path_is_a_directory_of_the_pods_node(tmp_path):
    real = tmp_path / "real" / "ckpt"
    run = _run(tmp_path, [{"name": "h", "hostPath": {"path": str(real), "type": "Directory"}}])
    on_a = isolation.pod_volumes(run, _body(), [], host="node-a")
    on_b = isolation.pod_volumes(run, _body(), [], host="node-b")
    where_a = tmp_path / "w" / "nodes" / "node-a" / "host" / str(real).lstrip("/")
    assert on_a == [Volume("/h", host_path=str(where_a))]
    assert on_b[0].host_path != on_a[0].host_path and "node-b" in on_b[0].host_path
    assert where_a.is_dir() and not real.exists()  # this machine's own path is left alone


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ({"path": "/var/../etc"}, "must not contain '..'"),
        ({"path": "data"}, "must be an absolute path"),
        ({"path": "/dev/nvidia0", "type": "CharDevice"}, "only a directory"),
        ({"path": "/etc/x", "type": "File"}, "only a directory"),
    ],
)
def test_a_host_path_kubernetes_refuses_is_one_line(tmp_path, source, why):
    run = _run(tmp_path, [{"name": "h", "hostPath": source}])
    with pytest.raises(ValueError, match=why):
        isolation.pod_volumes(run, _body(), [], host="node-a")
    problems = volumes.volume_problems(run.spec, None)
    assert problems == [("volumes.h.hostPath", volumes.host_path_problem(source))]
    assert why in problems[0][1]


def _script(name: str, node: str, code: str, **extra) -> dict:
    mounts = [{"name": "h", "mountPath": "/h"}, {"name": "e", "mountPath": "/e"}]
    container = {"image": "x", "command": ["python", "-c", code], "volumeMounts": mounts}
    return {
        "name": name,
        "nodeSelector": {"kubernetes.io/hostname": node},
        "container": container,
        **extra,
    }


WRITE = "open('/h/mark', 'w').write('left by write-a')"
READ = "import os; print(open('/h/mark').read() if os.path.exists('/h/mark') else 'none')"
# first attempt: leaves a file in the hostPath and one in the emptyDir, fails; the retry (a
# new pod on the same node) says what it finds of each
RETRY = """\
import os, sys
if os.path.exists('/h/try'):
    seen = 'found' if os.path.exists('/e/try') else 'none'
    print('host=found empty=' + seen)
    sys.exit(0)
open('/h/try', 'w').write('x')
open('/e/try', 'w').write('x')
sys.exit(1)
"""


@needs_pods
def test_host_path_per_node_survives_a_retry_on_its_node_and_empty_dir_does_not(tmp_path):
    profile = tmp_path / "cluster.yaml"
    profile.write_text(PROFILE)
    real = tmp_path / "real-host-dir"
    templates = [
        _script("write-a", "node-a", WRITE),
        _script("read-a", "node-a", READ),
        _script("read-b", "node-b", READ),
        _script("retry-a", "node-a", RETRY, retryStrategy={"limit": 1}),
    ]
    tasks = [
        {"name": "write-a", "template": "write-a"},
        {"name": "read-a", "template": "read-a", "dependencies": ["write-a"]},
        {"name": "read-b", "template": "read-b", "dependencies": ["write-a"]},
        {"name": "retry-a", "template": "retry-a"},
    ]
    manifest = {
        "metadata": {"name": "node-volumes"},
        "spec": {
            "entrypoint": "main",
            "activeDeadlineSeconds": 120,
            "volumes": [
                {"name": "h", "hostPath": {"path": str(real), "type": "DirectoryOrCreate"}},
                {"name": "e", "emptyDir": {}},
            ],
            "templates": [{"name": "main", "dag": {"tasks": tasks}}, *templates],
        },
    }
    result = run_workflow(
        manifest,
        workdir=str(tmp_path / "w"),
        name="node-volumes",
        stream=io.StringIO(),
        isolate=True,
        cluster=load_profile(str(profile)),
    )
    assert result.phase == "Succeeded", result.message
    pods = {n["displayName"]: n for n in result.nodes.values() if n["type"] == "Pod"}
    assert pods["read-a"]["outputs"]["result"] == "left by write-a"  # same node: seen
    assert pods["read-b"]["outputs"]["result"] == "none"  # another node: its own directory
    first, second = pods["retry-a(0)"], pods["retry-a(1)"]
    assert (first["phase"], second["phase"]) == ("Failed", "Succeeded")
    assert first["hostNodeName"] == second["hostNodeName"] == "node-a"
    # the node's directory outlived the first pod; its emptyDir did not
    assert second["outputs"]["result"] == "host=found empty=none"
    assert not real.exists()  # this machine's own path: untouched
    node_a = tmp_path / "w" / "nodes" / "node-a" / "host" / str(real).lstrip("/")
    assert (node_a / "mark").read_text() == "left by write-a"

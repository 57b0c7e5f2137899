"""Cluster profiles (runner/cluster.py): read as hostile input, one line naming file and field."""

from __future__ import annotations

from pathlib import Path

import pytest
from ckptflow.workflows.runner.cluster import ClusterError, default_cluster, load_profile

GOOD = """\
nodes:
- name: gpu-0
  labels: {nvidia.com/gpu.product: H100}
  taints: [{key: nvidia.com/gpu, effect: NoSchedule}]
  allocatable: {cpu: "8", memory: 64Gi, nvidia.com/gpu: "1"}
- name: cpu-0
  allocatable: {cpu: 500m, memory: 1G}
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return str(path)


def test_a_profile_is_read_with_implied_hostname(tmp_path):
    c = load_profile(write(tmp_path, GOOD))
    gpu, cpu = c.nodes
    assert gpu.name == "gpu-0"
    assert gpu.labels == {"nvidia.com/gpu.product": "H100", "kubernetes.io/hostname": "gpu-0"}
    assert gpu.taints == ({"key": "nvidia.com/gpu", "value": "", "effect": "NoSchedule"},)
    assert gpu.allocatable == {"cpu": 8000, "memory": 64 << 30, "nvidia.com/gpu": 1, "pods": 110}
    assert cpu.allocatable["cpu"] == 500 and cpu.allocatable["memory"] == 10**9


def test_default_cluster_is_this_machine():
    (only,) = default_cluster().nodes
    assert only.allocatable["cpu"] >= 1000 and only.allocatable["memory"] > 0
    assert only.labels["kubernetes.io/hostname"] == only.name and only.taints == ()


@pytest.mark.parametrize(
    "text, where",
    [
        ("", "top level: expected a mapping"),
        ("[1, 2]", "top level: expected a mapping"),
        ("nodes: []", "nodes: expected a list of 1-1000 nodes"),
        ("nodes:\n- {name: a, allocatable: {cpu: 1}}\nextra: 1", "unknown field 'extra'"),
        ("nodes:\n- {name: A_b, allocatable: {cpu: 1}}", "nodes[0].name"),
        ("nodes:\n- {name: a}", "nodes[0].allocatable: expected a mapping"),
        ("nodes:\n- {name: a, allocatable: {cpu: lots}}", "nodes[0].allocatable.cpu"),
        ("nodes:\n- {name: a, allocatable: {cpu: -1}}", "nodes[0].allocatable.cpu"),
        ("nodes:\n- {name: a, allocatable: {cpu: 1e999}}", "nodes[0].allocatable.cpu"),
        ("nodes:\n- {name: a, allocatable: {cpu: 1}, gpus: 2}", "nodes[0]: unknown field 'gpus'"),
        ("nodes:\n- {name: a, allocatable: {cpu: 1}, labels: {'bad key!': x}}", "labels.bad key!"),
        ("nodes:\n- {name: a, allocatable: {cpu: 1}, labels: {k: [1]}}", "labels.k"),
        (
            "nodes:\n- {name: a, allocatable: {cpu: 1}, taints: [{key: k, effect: Never}]}",
            "nodes[0].taints[0].effect",
        ),
        (
            "nodes:\n- {name: a, allocatable: {cpu: 1}, taints: [{effect: NoSchedule}]}",
            "taints[0].key",
        ),
        (
            "nodes:\n- {name: a, allocatable: {cpu: 1}, labels: {kubernetes.io/hostname: b}}",
            "kubernetes.io/hostname must be the node's name",
        ),
        (
            "nodes:\n- {name: a, allocatable: {cpu: 1}}\n- {name: a, allocatable: {cpu: 1}}",
            "node name 'a' is used twice",
        ),
        ("nodes: [", "not YAML"),
    ],
)
def test_profile_errors_are_one_line_naming_file_and_field(tmp_path, text, where):
    path = write(tmp_path, text)
    with pytest.raises(ClusterError) as info:
        load_profile(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and where in message
    assert "\n" not in message and len(message) <= 300


def test_a_huge_or_missing_profile_is_refused(tmp_path):
    path = write(tmp_path, "#" * (2 << 20))
    with pytest.raises(ClusterError, match="larger than"):
        load_profile(path)
    with pytest.raises(ClusterError, match="cannot read"):
        load_profile(str(tmp_path / "none.yaml"))
    many = "nodes:\n" + "".join(f"- {{name: n{i}, allocatable: {{cpu: 1}}}}\n" for i in range(1001))
    with pytest.raises(ClusterError, match="1-1000 nodes"):
        load_profile(write(tmp_path, many))

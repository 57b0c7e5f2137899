"""The cluster a run is scheduled on: nodes with labels, taints and allocatable resources.

A cluster profile (`ckptflow run FILE --isolate --cluster PROFILE.yaml`, `ckptflow check
--cluster PROFILE.yaml`) is a YAML file:

    nodes:
    - name: gpu-0
      labels: {nvidia.com/gpu.product: H100}      # kubernetes.io/hostname is implied
      taints: [{key: nvidia.com/gpu, effect: NoSchedule}]
      allocatable: {cpu: "8", memory: 64Gi, nvidia.com/gpu: "1"}

Top-level settings of the control plane's handling of a lost node (`--fail-node`,
nodelifecycle.py), each with its Kubernetes default:

    nodeMonitorGracePeriod: 50s              # kube-controller-manager --node-monitor-grace-period
    nodeMonitorPeriod: 5s                    # kube-controller-manager --node-monitor-period
    defaultNotReadyTolerationSeconds: 300    # kube-apiserver --default-not-ready-toleration-seconds
    defaultUnreachableTolerationSeconds: 300 # kube-apiserver --default-unreachable-toleration-seconds
    disableAdmissionPlugins: [DefaultTolerationSeconds]   # kube-apiserver flag of that name

Without one the cluster is this machine as one node (what a k3d cluster gives). The file is read
as hostile input: its size, the number of nodes, labels, taints and resources are bounded and
every field is checked; a mistake is one `ClusterError` line naming the file and the field.
Quantities are held as integers: cpu in millicores, everything else in whole units (bytes for
memory), as the scheduler's `framework.Resource` holds them (pkg/scheduler/framework/types.go).
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field
from decimal import ROUND_CEILING
from pathlib import Path

import yaml
from ckptflow.workflows.runner.pods.podspec import _decimal  # the one Kubernetes quantity parser
from ckptflow.workflows.runner.substitution import parse_duration

__all__ = [
    "CPU",
    "HOSTNAME_LABEL",
    "Cluster",
    "ClusterError",
    "ClusterNode",
    "LifecycleSettings",
    "default_cluster",
    "load_profile",
    "resource_units",
]

CPU, MEMORY, PODS = "cpu", "memory", "pods"
HOSTNAME_LABEL = "kubernetes.io/hostname"
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
MAX_FILE_BYTES = 1 << 20  # a profile of 1,000 nodes is ~200 KiB
MAX_NODES = 1000
MAX_ENTRIES = 64  # labels, taints or resources of one node
MAX_UNITS = 2**63 - 1
DEFAULT_PODS = 110  # the kubelet's default maxPods

# Label keys and values (k8s.io/apimachinery/pkg/util/validation/validation.go).
_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_DNS = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?)*"
_LABEL_KEY = re.compile(rf"^(?:{_DNS}/)?{_NAME}$")
_LABEL_VALUE = re.compile(rf"^(?:{_NAME})?$")
_NODE_NAME = re.compile(rf"^{_DNS}$")


class ClusterError(ValueError):
    """A cluster profile that cannot be used; the message is one line naming file and field."""


@dataclass(frozen=True)
class ClusterNode:
    """One node of the cluster, as the scheduler sees it (`v1.Node` reduced to what filters read)."""

    name: str
    labels: dict[str, str]
    taints: tuple[dict, ...]  # {"key", "value" (may be ""), "effect"}
    allocatable: dict[str, int]  # resource -> units (cpu in millicores)


@dataclass(frozen=True)
class LifecycleSettings:
    """How the control plane handles a node that stops reporting (nodelifecycle.py)."""

    # kube-controller-manager --node-monitor-grace-period: 50s since v1.32 (40s before;
    # kubernetes/kubernetes#126287, pkg/controller/nodelifecycle/config/v1alpha1/defaults.go)
    node_monitor_grace_s: float = 50.0
    node_monitor_period_s: float = 5.0  # --node-monitor-period: how often node health is checked
    not_ready_toleration_s: int = 300  # kube-apiserver --default-not-ready-toleration-seconds
    unreachable_toleration_s: int = 300  # --default-unreachable-toleration-seconds
    default_tolerations: bool = True  # the DefaultTolerationSeconds admission plugin is on


@dataclass(frozen=True)
class Cluster:
    """The nodes in profile order: the scheduler binds a pod to the first one that passes."""

    nodes: tuple[ClusterNode, ...]
    source: str = "this machine"
    names: frozenset[str] = field(default=frozenset(), compare=False)
    lifecycle: LifecycleSettings = field(default_factory=LifecycleSettings, compare=False)


def resource_units(name: str, value, what: str) -> int:
    """A quantity as integer units: millicores for cpu, rounded up; ValueError if it is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{what} {value!r} is not a Kubernetes quantity")
    text = str(value)
    if len(text) > 64:
        raise ValueError(f"{what}: a quantity of {len(text)} characters is not one")
    exact = _decimal(text, what) * (1000 if name == CPU else 1)
    out = int(exact.to_integral_value(rounding=ROUND_CEILING))
    if not 0 <= out <= MAX_UNITS:
        raise ValueError(f"{what} {value!r} is out of range")
    return out


def _meminfo_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 34  # 16 GiB where /proc says nothing


def default_cluster() -> Cluster:
    """This machine as one untainted node with its CPUs and memory (a k3d cluster's one node)."""
    name = re.sub(r"[^a-z0-9.-]", "-", socket.gethostname().lower()).strip("-.")[:63] or "local"
    node = ClusterNode(
        name=name,
        labels={HOSTNAME_LABEL: name, "kubernetes.io/os": "linux"},
        taints=(),
        allocatable={
            CPU: (os.cpu_count() or 1) * 1000,
            MEMORY: _meminfo_bytes(),
            PODS: DEFAULT_PODS,
        },
    )
    return Cluster((node,), "this machine", frozenset([name]))


def _fail(path: str, where: str, why: str) -> ClusterError:
    text = f"{path}: {where}: {why}".replace("\n", " ")
    return ClusterError(text if len(text) <= 300 else text[:297] + "...")


def _mapping(obj, path: str, where: str, allowed: set[str]) -> dict:
    if not isinstance(obj, dict):
        raise _fail(path, where, f"expected a mapping, got {type(obj).__name__}")
    unknown = sorted(str(k) for k in obj if k not in allowed)
    if unknown:
        raise _fail(
            path, where, f"unknown field {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})"
        )
    return obj


def _labels(obj, path: str, where: str) -> dict[str, str]:
    if obj is None:
        return {}
    if not isinstance(obj, dict) or len(obj) > MAX_ENTRIES:
        raise _fail(path, where, f"expected a mapping of at most {MAX_ENTRIES} labels")
    out = {}
    for k, v in obj.items():
        if not isinstance(k, str) or len(k) > 316 or not _LABEL_KEY.match(k):
            raise _fail(path, f"{where}.{k}", "not a valid label key")
        value = v if isinstance(v, str) else None if isinstance(v, (bool, dict, list)) else str(v)
        if value is None or not _LABEL_VALUE.match(value):
            raise _fail(path, f"{where}.{k}", f"{v!r} is not a valid label value (63 characters)")
        out[k] = value
    return out


def _taints(obj, path: str, where: str) -> tuple[dict, ...]:
    if obj is None:
        return ()
    if not isinstance(obj, list) or len(obj) > MAX_ENTRIES:
        raise _fail(path, where, f"expected a list of at most {MAX_ENTRIES} taints")
    out = []
    for i, t in enumerate(obj):
        at = f"{where}[{i}]"
        _mapping(t, path, at, {"key", "value", "effect"})
        key, value, effect = t.get("key"), t.get("value", ""), t.get("effect")
        if not isinstance(key, str) or not _LABEL_KEY.match(key):
            raise _fail(path, f"{at}.key", f"{key!r} is not a valid taint key")
        if not isinstance(value, str) or not _LABEL_VALUE.match(value):
            raise _fail(path, f"{at}.value", f"{value!r} is not a valid taint value")
        if effect not in TAINT_EFFECTS:
            raise _fail(path, f"{at}.effect", f"{effect!r}: use one of {', '.join(TAINT_EFFECTS)}")
        out.append({"key": key, "value": value, "effect": effect})
    return tuple(out)


def _allocatable(obj, path: str, where: str) -> dict[str, int]:
    if not isinstance(obj, dict) or not obj or len(obj) > MAX_ENTRIES:
        raise _fail(
            path, where, f"expected a mapping of 1-{MAX_ENTRIES} resources (cpu, memory, ...)"
        )
    out = {}
    for k, v in obj.items():
        if not isinstance(k, str) or not _LABEL_KEY.match(k):
            raise _fail(path, f"{where}.{k}", "not a valid resource name")
        try:
            out[k] = resource_units(k, v, f"{where}.{k}")
        except ValueError as exc:
            raise _fail(path, f"{where}.{k}", str(exc)) from None
    out.setdefault(PODS, DEFAULT_PODS)
    return out


def _node(obj, path: str, i: int) -> ClusterNode:
    where = f"nodes[{i}]"
    _mapping(obj, path, where, {"name", "labels", "taints", "allocatable"})
    name = obj.get("name")
    if not isinstance(name, str) or len(name) > 253 or not _NODE_NAME.match(name):
        raise _fail(path, f"{where}.name", f"{name!r} is not a node name (lowercase DNS name)")
    labels = _labels(obj.get("labels"), path, f"{where}.labels")
    if labels.setdefault(HOSTNAME_LABEL, name) != name:
        raise _fail(path, f"{where}.labels", f"{HOSTNAME_LABEL} must be the node's name {name!r}")
    taints = _taints(obj.get("taints"), path, f"{where}.taints")
    return ClusterNode(
        name, labels, taints, _allocatable(obj.get("allocatable"), path, f"{where}.allocatable")
    )


MAX_LIFECYCLE_S = 86400  # a day: longer is no test of a node loss
LIFECYCLE_KEYS = {
    "nodeMonitorGracePeriod": "node_monitor_grace_s",
    "nodeMonitorPeriod": "node_monitor_period_s",
    "defaultNotReadyTolerationSeconds": "not_ready_toleration_s",
    "defaultUnreachableTolerationSeconds": "unreachable_toleration_s",
}
ADMISSION_PLUGINS = ("DefaultTolerationSeconds",)  # the ones the model has


def _lifecycle(doc: dict, path: str) -> LifecycleSettings:
    """The profile's node-lifecycle settings: durations ("40s", "1m", or seconds) for the two
    periods, whole seconds for the tolerations, each in 0..a day; the periods above 0."""
    values: dict = {}
    for key, attr in LIFECYCLE_KEYS.items():
        if key not in doc:
            continue
        raw = doc[key]
        whole = key.endswith("Seconds")
        try:
            if isinstance(raw, bool) or (whole and not isinstance(raw, int)):
                raise ValueError(f"{raw!r} is not a whole number of seconds")
            value = raw if whole else parse_duration(raw)
        except ValueError as exc:
            raise _fail(path, key, str(exc)) from None
        above = value >= 0 if whole else value > 0  # NaN is neither
        if not above or value > MAX_LIFECYCLE_S:
            raise _fail(path, key, f"{raw!r} is out of range (0-{MAX_LIFECYCLE_S} s)")
        values[attr] = value
    disabled = doc.get("disableAdmissionPlugins") or []
    if not isinstance(disabled, list) or any(p not in ADMISSION_PLUGINS for p in disabled):
        raise _fail(
            path, "disableAdmissionPlugins", f"a list of {', '.join(ADMISSION_PLUGINS)} only"
        )
    return LifecycleSettings(
        **values, default_tolerations="DefaultTolerationSeconds" not in disabled
    )


def load_profile(path: str) -> Cluster:
    """The cluster of a profile file; ClusterError (one line naming the file) if it is not one."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise _fail(path, "cannot read", exc.strerror or str(exc)) from None
    if len(raw) > MAX_FILE_BYTES:
        raise _fail(path, "file", f"larger than {MAX_FILE_BYTES} bytes")
    try:
        doc = yaml.safe_load(raw.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise _fail(path, "not YAML", str(exc).splitlines()[0] if str(exc) else "") from None
    _mapping(doc, path, "top level", {"nodes", "disableAdmissionPlugins", *LIFECYCLE_KEYS})
    nodes = doc.get("nodes")
    if not isinstance(nodes, list) or not 1 <= len(nodes) <= MAX_NODES:
        raise _fail(path, "nodes", f"expected a list of 1-{MAX_NODES} nodes")
    out = [_node(n, path, i) for i, n in enumerate(nodes)]
    names = [n.name for n in out]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise _fail(path, "nodes", f"node name {dup!r} is used twice")
    return Cluster(tuple(out), path, frozenset(names), _lifecycle(doc, path))

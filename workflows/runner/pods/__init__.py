"""Pods on this machine: each task in its own network, UTS and mount namespaces and cgroups.

The sandbox library behind `ckptflow run FILE --isolate` (see docs/pods.md). It imports only
the standard library and the runner's `process` (the process-group stop); the plumbing is
iproute2 (`ip`), util-linux (`unshare`, `nsenter`) and cgroup v1, and it needs root.

    why = available()            # None, or the one missing privilege/tool
    with Node() as node:         # a bridge with the node address, a subnet, cgroups
        pod = node.start_pod("a", argv, env, cwd, log_path=..., memory_limit="64Mi")
        pod.poll(); pod.ip; pod.finish(); pod.release()
"""

from ckptflow.workflows.runner.pods.check import available
from ckptflow.workflows.runner.pods.naming import PREFIX
from ckptflow.workflows.runner.pods.net import POD_CIDR, NetError
from ckptflow.workflows.runner.pods.node import Node
from ckptflow.workflows.runner.pods.pod import Pod, PodError
from ckptflow.workflows.runner.pods.podspec import (
    Volume,
    check_hostname,
    downward_env,
    parse_cpu,
    parse_quantity,
)
from ckptflow.workflows.runner.pods.sweep import STATE_ROOT, leftovers, sweep

__all__ = [
    "POD_CIDR",
    "PREFIX",
    "STATE_ROOT",
    "NetError",
    "Node",
    "Pod",
    "PodError",
    "Volume",
    "available",
    "check_hostname",
    "downward_env",
    "leftovers",
    "parse_cpu",
    "parse_quantity",
    "sweep",
]

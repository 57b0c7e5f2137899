"""Rules about one pod's placement and outcome that the leaf executor (leaf.py) applies: where a
pod runs when there is no cluster model, what a daemon's exit means, and the env a podSpecPatch
gives its container.

Each rule is one function citing the Argo or Kubernetes source it follows.
"""

from __future__ import annotations

import functools
import time

import yaml
from ckptflow.workflows.runner import context as cx
from ckptflow.workflows.runner.cluster import ClusterNode, default_cluster
from ckptflow.workflows.runner.nodes import FAILED, SUCCEEDED, Node
from ckptflow.workflows.runner.placement import (
    PodRequest,
    fit_error,
    match_node_affinity,
    pending_message,
)
from ckptflow.workflows.runner.substitution import parse_duration, to_str

__all__ = [
    "DAEMON_SUCCEEDED",
    "bind_this_machine",
    "patched_env",
    "pending_scope",
    "pod_succeeded",
]

# the words of workflow/controller/operator.go assessNodeStatus (its log line; the node's phase
# is what changes there, the message says why)
DAEMON_SUCCEEDED = "Daemoned pod succeeded. Marking it as failed"
# operator.go failNodesWithinDeadline...: a Pending node past the workflow's deadline
PENDING_PAST_DEADLINE = "Step exceeded its deadline"


def pod_succeeded(body: dict) -> tuple[str, str]:
    """(phase, message) of a pod that exited 0 by itself (not stopped at its scope's end). A
    daemon must run until its scope ends, so Argo marks a daemon template's pod that succeeds
    Failed, and its retryStrategy retries it (workflow/controller/operator.go
    assessNodeStatus, case PodSucceeded: `tmpl.IsDaemon()`)."""
    if body.get("daemon"):
        return FAILED, DAEMON_SUCCEEDED
    return SUCCEEDED, ""


@functools.cache
def this_machine() -> ClusterNode:
    """This machine as the one node of a cluster with no model (a k3d cluster's one node)."""
    return default_cluster().nodes[0]


def _required_terms(body: dict, spec: dict) -> tuple[dict, ...]:
    affinity = body.get("affinity") or spec.get("affinity") or {}
    required = (affinity.get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    return tuple(required.get("nodeSelectorTerms") or ())


def _has_deadline(scope: cx.Scope | None) -> bool:
    while scope is not None:
        if scope.deadline is not None:
            return True
        scope = scope.parent
    return False


def pending_scope(body: dict, scope: cx.Scope) -> cx.Scope:
    """The scope a Pending (not yet bound) pod waits in: `scope` and the template's `timeout`,
    never the pod's own activeDeadlineSeconds. Kubernetes counts that from the pod's startTime,
    which the kubelet sets when it admits the pod on a node (pkg/kubelet/active_deadline.go), so
    a pod that is never bound is not ended by it; the template's `timeout` counts Pending time
    (workflow/controller/operator.go checkTemplateTimeouts) and the workflow's deadline ends it
    too. Used by both placements: this machine (below) and the cluster model
    (isolation.bind_pod)."""
    timeout = body.get("timeout")
    if timeout is not None and to_str(timeout).strip():
        return scope.child(parse_duration(timeout), cx.TEMPLATE_DEADLINE)
    return scope


def bind_this_machine(run: cx.Run, node: Node, body: dict, scope: cx.Scope) -> bool:
    """Without isolation every pod runs on this machine, the cluster's one node: True with the
    node's `hostNodeName` set. A pod whose required node affinity excludes it (a retry's
    anti-affinity: execute.retry_on_different_host) can never be scheduled
    (pkg/scheduler/framework/plugins/nodeaffinity/node_affinity.go, placement.py): it stays
    Pending with the scheduler's message until the scope's deadline fails it, as a Pending pod
    past the workflow's deadline is (workflow/controller/operator.go). With no deadline anywhere
    it would stay Pending forever on Argo; here it fails at once, saying so. False then.

    `scope` is the pod's pending_scope (leaf.run_leaf), so its own activeDeadlineSeconds does
    not end it. Only required node affinity is read here (this node has only the hostname and os labels);
    with `--isolate` the scheduler over the cluster model also checks nodeSelector, taints and
    resources."""
    local = this_machine()
    why = match_node_affinity(
        PodRequest(node.id, {}, {}, (), _required_terms(body, run.spec)), local
    )
    if why is None:
        run.store.update(node, host_node_name=local.name)
        return True
    message = pending_message(fit_error(1, {local.name: [why]}))
    if not _has_deadline(scope):
        run.store.update(
            node, phase=FAILED, message=f"{message} No deadline ends it: on Argo it stays Pending"
        )
        return False
    run.store.update(node, message=message)
    while scope.reason() is None:
        time.sleep(0.05)
    kind, text = scope.reason()
    run.store.update(
        node, phase=FAILED, message=PENDING_PAST_DEADLINE if kind == cx.DEADLINE else text
    )
    return False


MAIN_CONTAINER = "main"  # the name Argo gives a template's container (common.MainContainerName)


def patched_env(container: dict, patch: str) -> list:
    """The main container's env once a template's podSpecPatch is applied. Argo merges the
    patch into the pod it built (workflow/controller/workflowpod.go: util.ApplyPodSpecPatch, a
    strategic merge patch, YAML converted to JSON first), and in a PodSpec `containers` and
    their `env` merge by `name` (k8s.io/api core/v1 patchMergeKey): an entry of the patch
    replaces the container's entry of that name, a new one is added. The patch's other fields
    change where and how a pod runs on a node, which the runner does not model (spec.py ignores
    them). ValueError (one line) for a patch Argo could not apply."""
    env = list(container.get("env") or [])
    if not patch:
        return env
    try:
        value = yaml.safe_load(patch)
    except yaml.YAMLError as exc:
        raise ValueError(
            f"podSpecPatch: not valid YAML/JSON ({getattr(exc, 'problem', '')})"
        ) from None
    if not isinstance(value, dict):
        raise ValueError("podSpecPatch: expected a mapping of Pod spec fields")
    containers = value.get("containers", [])
    if not isinstance(containers, list) or not all(isinstance(c, dict) for c in containers):
        raise ValueError("podSpecPatch: containers is a list of containers by name")
    for c in containers:
        if c.get("name") == MAIN_CONTAINER:
            env = _merge_env(env, c.get("env") or [])
    return env


def _merge_env(env: list, patch: list) -> list:
    """`patch` entries (name, plain value) merged into `env` by name, in the container's order
    with new names after it (strategicpatch mergeSlice)."""
    if not isinstance(patch, list):
        raise ValueError(f"podSpecPatch: containers[{MAIN_CONTAINER}].env is a list")
    out = {e.get("name"): e for e in env}
    for i, entry in enumerate(patch):
        if (
            not isinstance(entry, dict)
            or set(entry) != {"name", "value"}
            or not all(isinstance(v, str) for v in entry.values())
        ):
            raise ValueError(
                f"podSpecPatch: containers[{MAIN_CONTAINER}].env[{i}]: a name and a string "
                "value (the runner reads no valueFrom there)"
            )
        out[entry["name"]] = {"name": entry["name"], "value": entry["value"]}
    return list(out.values())

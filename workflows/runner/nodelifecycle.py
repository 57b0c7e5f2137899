"""A node lost silently, and what Kubernetes and Argo then do (`ckptflow run FILE --isolate
--cluster PROFILE --fail-node NODE@SECONDS`).

SECONDS after the first pod on NODE started, the node "loses power": every pod bound to it is
frozen (cgroup freezer: no signal, no exit, sockets left open) and its traffic is dropped
silently (`pods.net.drop_pod_traffic`: peers get no FIN, RST or ICMP, only timeouts). Nothing
is killed. From then on the model follows the control plane, one rule per function:

1. the node lifecycle controller marks the node's Ready condition Unknown once it has not
   heard from the kubelet for nodeMonitorGracePeriod, checking every nodeMonitorPeriod
   (`node_ready_condition`), and taints it `node.kubernetes.io/unreachable` NoExecute and
   NoSchedule (`unreachable_taints`): the scheduler then binds nothing new there;
2. the taint eviction controller deletes each pod on the node after the smallest
   tolerationSeconds of its tolerations matching the NoExecute taint, at once when none
   matches, never when a matching one has no tolerationSeconds (`eviction_delay`); every pod
   has the 300 s tolerations the DefaultTolerationSeconds admission plugin adds
   (`admitted_tolerations`), unless the profile disables that plugin;
3. Argo marks the deleted pod's node Error "pod deleted" (`ARGO_POD_DELETED`), once the pod
   is older than RECENTLY_STARTED_POD_DURATION (`argo_marks_pod_deleted`); its retryStrategy
   retries that (Always/OnError) on a node the scheduler still binds to.

A deleted pod on an unreachable node stays Terminating in the API until its node is removed
(or tainted out-of-service) and PodGC force-deletes it (pkg/controller/podgc/gc_controller.go);
the model takes the deletion as done, the case of a node that is gone for good. The evicted
pod itself stays frozen on its "dead" node until the run ends, when it is thawed and killed
with every other pod (`Isolation.close`).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ckptflow.workflows.runner.cluster import Cluster, LifecycleSettings
from ckptflow.workflows.runner.placement import tolerates
from ckptflow.workflows.runner.pods import cgroups, net

__all__ = [
    "ARGO_POD_DELETED",
    "EVICTED",
    "FailNode",
    "NodeLifecycle",
    "admitted_tolerations",
    "argo_marks_pod_deleted",
    "eviction_delay",
    "freezer_problem",
    "node_ready_condition",
    "parse_fail_node",
    "unreachable_taints",
]

NOT_READY = "node.kubernetes.io/not-ready"
UNREACHABLE = "node.kubernetes.io/unreachable"
EVICTED = "evicted"  # the kind of reason a leaf's supervision ends with (leaf._supervise)
# workflow/controller/operator.go podReconciliation: a started pod node whose pod is gone
ARGO_POD_DELETED = "pod deleted"
# pkg/controller/tainteviction/taint_eviction.go addConditionAndDeletePod
DISRUPTION = "DeletionByTaintManager: Taint manager: deleting due to NoExecute taint"
# operator.go recentlyStarted: RECENTLY_STARTED_POD_DURATION, default 10s
RECENTLY_STARTED_S = 10.0
MAX_FAIL_AFTER_S = 86400.0
TICK_S = 0.05


@dataclass(frozen=True)
class FailNode:
    """`--fail-node NODE@SECONDS`: NODE fails silently SECONDS after its first pod started."""

    node: str
    after_s: float


def parse_fail_node(text: str, cluster: Cluster) -> FailNode:
    """The FailNode of `NODE@SECONDS` (SECONDS a number or duration, 0 up to a day) on a node of
    `cluster`; ValueError (one line naming the fix) otherwise."""
    node, sep, when = text.rpartition("@")
    if not sep or not node or not when:
        raise ValueError(f"--fail-node {text!r}: expected NODE@SECONDS (e.g. gpu-1@30)")
    if node not in {n.name for n in cluster.nodes}:
        names = ", ".join(n.name for n in cluster.nodes[:10])
        raise ValueError(f"--fail-node {text!r}: no node {node!r} in {cluster.source} ({names})")
    from ckptflow.workflows.runner.substitution import parse_duration

    try:
        seconds = parse_duration(when)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= MAX_FAIL_AFTER_S:
        raise ValueError(
            f"--fail-node {text!r}: {when!r} is not a time of 0-{MAX_FAIL_AFTER_S:.0f} s"
        )
    return FailNode(node, seconds)


def fail_nodes_of(texts: list[str], cluster: Cluster | None) -> list[FailNode]:
    """The FailNodes of `--fail-node` options (`ckptflow run FILE` and `ckptflow run pipeline
    --local` alike): each on a node of `cluster`, a node once, on a host that can freeze pods;
    ValueError (one line naming the fix) otherwise."""
    if not texts:
        return []
    if cluster is None:
        raise ValueError("--fail-node fails a node of a cluster profile: add --cluster PROFILE")
    failures = [parse_fail_node(text, cluster) for text in texts]
    names = [f.node for f in failures]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise ValueError(f"--fail-node: node {twice!r} is given twice (a node fails once)")
    problem = freezer_problem()
    if problem:
        raise ValueError(problem)
    return failures


def freezer_problem() -> str | None:
    """Why a lost node's pods cannot be frozen here (one line), or None."""
    if not os.path.exists(os.path.join(cgroups.mount_of("freezer"), "cgroup.procs")):
        where = cgroups.mount_of("freezer")
        return f"--fail-node needs the cgroup v1 freezer controller (none at {where})"
    return None


def admitted_tolerations(tolerations, settings: LifecycleSettings) -> tuple[dict, ...]:
    """A pod's tolerations after the DefaultTolerationSeconds admission plugin
    (plugin/pkg/admission/defaulttolerationseconds/admission.go Admit): unless it already has
    one for the key (or an empty key) with effect NoExecute (or empty), a pod gets
    `not-ready`/`unreachable` Exists NoExecute with the cluster's default seconds (300)."""
    out = tuple(t for t in tolerations or () if isinstance(t, dict))
    if not settings.default_tolerations:
        return out
    for key, seconds in (
        (NOT_READY, settings.not_ready_toleration_s),
        (UNREACHABLE, settings.unreachable_toleration_s),
    ):
        if not any(
            (t.get("key") or "") in (key, "") and (t.get("effect") or "") in ("NoExecute", "")
            for t in out
        ):
            out += (
                {
                    "key": key,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": seconds,
                },
            )
    return out


def node_ready_condition(silent_s: float, grace_s: float) -> dict | None:
    """The node's Ready condition once the kubelet has been silent `silent_s` seconds
    (pkg/controller/nodelifecycle/node_lifecycle_controller.go tryUpdateNodeHealth: past
    nodeMonitorGracePeriod since the last heartbeat it is Unknown); None while still Ready."""
    if silent_s <= grace_s:
        return None
    return {
        "type": "Ready",
        "status": "Unknown",
        "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
    }


def unreachable_taints() -> tuple[dict, ...]:
    """The taints of a node whose Ready condition is Unknown (node_lifecycle_controller.go:
    processTaintBaseEviction adds UnreachableTaintTemplate, NoExecute; doNoScheduleTaintingPass
    maps Ready=Unknown to `node.kubernetes.io/unreachable` NoSchedule)."""
    return (
        {"key": UNREACHABLE, "value": "", "effect": "NoExecute"},
        {"key": UNREACHABLE, "value": "", "effect": "NoSchedule"},
    )


def eviction_delay(tolerations, taints) -> float | None:
    """Seconds after the NoExecute taints appear that a pod is deleted, or None for never
    (pkg/controller/tainteviction/taint_eviction.go processPodOnNode and getMinTolerationTime):
    a taint no toleration matches: at once; else the smallest tolerationSeconds of the matching
    tolerations (<= 0: at once); matching ones without tolerationSeconds: never."""
    no_execute = [t for t in taints if t["effect"] == "NoExecute"]
    if not no_execute:
        return None
    used = []
    for taint in no_execute:
        matching = [t for t in tolerations if tolerates(t, taint)]
        if not matching:
            return 0.0
        used.extend(matching)
    seconds = [t["tolerationSeconds"] for t in used if t.get("tolerationSeconds") is not None]
    if not seconds:
        return None
    try:
        least = min(float(s) for s in seconds)
    except (TypeError, ValueError):
        return 0.0  # the API server refuses such a pod; the model evicts it rather than hang
    return max(0.0, least)


def argo_marks_pod_deleted(pod_age_s: float) -> bool:
    """Whether Argo marks a started pod node whose pod is gone Error "pod deleted"
    (workflow/controller/operator.go podReconciliation): not while the node started within
    RECENTLY_STARTED_POD_DURATION (the informer may lag; it requeues and looks again)."""
    return pod_age_s > RECENTLY_STARTED_S


@dataclass
class _Pod:
    key: str
    host: str
    pod: object  # pods.Pod
    tolerations: tuple[dict, ...]
    started_at: float = 0.0
    evict_at: float | None = None
    evicted: bool = False


@dataclass
class _Node:
    name: str
    fail: FailNode | None
    first_pod_at: float | None = None
    failed_at: float | None = None  # the kubelet's last heartbeat
    not_ready_at: float | None = None
    pods: list[_Pod] = field(default_factory=list)


class NodeLifecycle:
    """The silent failures of one run and the control plane's answer; see the module docstring.

    `pod_started` is told of each pod once it runs; `evicted(key)` says when its pod was
    deleted. A thread applies the rules every TICK_S; `events` records what happened when
    (monotonic seconds), e.g. for a test to measure detection and eviction times."""

    def __init__(
        self,
        cluster: Cluster,
        failures: list[FailNode],
        taint: Callable[[str, tuple[dict, ...]], None],
        say: Callable[[str], None] = lambda line: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = cluster.lifecycle
        self._nodes = {f.node: _Node(f.node, f) for f in failures}
        self._taint, self._say, self._clock = taint, say, clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._started_at = clock()
        self._next_monitor = self._started_at + self.settings.node_monitor_period_s
        self.events: list[dict] = []
        self._thread = threading.Thread(target=self._loop, daemon=True, name="node-lifecycle")

    def start(self) -> NodeLifecycle:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _event(self, kind: str, subject: str, message: str) -> None:
        now = self._clock()
        self.events.append(
            {
                "at": now,
                "atUnix": time.time(),
                "event": kind,
                "subject": subject,
                "message": message,
            }
        )
        self._say(f"{kind} {subject}: {message}")

    # --- what the runner tells it, and asks ------------------------------------------------
    def pod_started(self, key: str, host: str | None, pod, tolerations) -> None:
        """Pod `key` (a pods.Pod) runs on node `host`, with the tolerations of its spec."""
        node = self._nodes.get(host or "")
        if node is None:
            return
        tolerations = admitted_tolerations(tolerations, self.settings)
        entry = _Pod(key, node.name, pod, tolerations, self._clock())
        with self._lock:
            node.pods.append(entry)
            if node.first_pod_at is None:
                node.first_pod_at = self._clock()
            dead = node.failed_at is not None
        if dead:  # a pod bound before the taint, started after the loss: it never really ran
            self._silence(entry)
            if node.not_ready_at is not None:
                self._schedule_eviction(node, entry, self._clock())

    def evicted(self, key: str) -> bool:
        """Whether pod `key` was deleted by the taint eviction controller and Argo saw it gone
        (`argo_marks_pod_deleted`)."""
        now = self._clock()
        with self._lock:
            return any(
                p.key == key and p.evicted and argo_marks_pod_deleted(now - p.started_at)
                for n in self._nodes.values()
                for p in n.pods
            )

    # --- the rules, in time order ----------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(TICK_S):
            now = self._clock()
            for node in list(self._nodes.values()):
                self._maybe_fail(node, now)
            if now >= self._next_monitor:  # monitorNodeHealth runs every nodeMonitorPeriod
                self._next_monitor += self.settings.node_monitor_period_s
                for node in list(self._nodes.values()):
                    self._monitor_node_health(node, now)
            for node in list(self._nodes.values()):
                self._evict_due(node, now)

    def _maybe_fail(self, node: _Node, now: float) -> None:
        """The node fails `after_s` after its first pod started: its pods freeze, go silent."""
        with self._lock:
            if node.failed_at is not None or node.first_pod_at is None:
                return
            if now < node.first_pod_at + node.fail.after_s:
                return
            node.failed_at = now
            pods = list(node.pods)
        for entry in pods:
            self._silence(entry)
        self._event(
            "NodeLost", node.name, f"{len(pods)} pod(s) frozen, their traffic dropped silently"
        )

    def _silence(self, entry: _Pod) -> None:
        """Drop the pod's traffic, then freeze it (so nothing it does on the way out is seen).
        A pod that already ended has nothing left to stop."""
        pod = entry.pod
        if pod.poll() is not None or pod.cgroups is None:
            return
        try:
            net.drop_pod_traffic(pod.pid)
            pod.cgroups.freeze()
        except (net.NetError, OSError) as exc:  # it ended meanwhile, or the host cannot
            if pod.poll() is None:
                self._event("NodeLostIncomplete", entry.key, f"not frozen and silenced: {exc}")

    def _monitor_node_health(self, node: _Node, now: float) -> None:
        """monitorNodeHealth: a node silent past the grace period goes Ready=Unknown and is
        tainted unreachable (NoExecute, NoSchedule); its pods' evictions are scheduled."""
        with self._lock:
            if node.failed_at is None or node.not_ready_at is not None:
                return
            condition = node_ready_condition(
                now - node.failed_at, self.settings.node_monitor_grace_s
            )
            if condition is None:
                return
            node.not_ready_at = now
            pods = [p for p in node.pods if p.pod.poll() is None]  # those that ended are gone
        self._taint(node.name, unreachable_taints())
        self._event(
            "NodeNotReady",
            node.name,
            f"Ready={condition['status']} ({condition['reason']}: {condition['message']}) "
            f"{now - node.failed_at:.1f}s after it went silent; tainted {UNREACHABLE}",
        )
        for entry in pods:
            self._schedule_eviction(node, entry, now)

    def _schedule_eviction(self, node: _Node, entry: _Pod, tainted_at: float) -> None:
        delay = eviction_delay(entry.tolerations, unreachable_taints())
        with self._lock:
            entry.evict_at = None if delay is None else tainted_at + delay
        if delay is None:
            self._event("TaintToleratedForever", entry.key, f"tolerates {UNREACHABLE} forever")

    def _evict_due(self, node: _Node, now: float) -> None:
        """The taint eviction controller deletes the pods whose toleration time is up."""
        due = []
        with self._lock:
            for entry in node.pods:
                if not entry.evicted and entry.evict_at is not None and now >= entry.evict_at:
                    entry.evicted = True
                    due.append(entry)
        for entry in due:
            waited = now - (node.not_ready_at or now)
            self._event(
                "TaintManagerEviction", entry.key, f"{DISRUPTION} ({waited:.1f}s after the taint)"
            )

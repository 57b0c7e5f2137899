"""Where a pod can go: what the scheduler reads of a pod (`pod_request`), the kube-scheduler's
filters, their FitError message, and first-fit placement of one pod or a gang's pods (`place`,
`place_gang`) without binding anything. Pure functions of the cluster and what is in use: the
stateful binding (queue, accounting, gangs waiting) is the Scheduler's (scheduler.py), and
`ckptflow check` (cluster_check.py) places pods on an empty cluster with the same functions.

Each filter is one function following its plugin in kubernetes/kubernetes
`pkg/scheduler/framework/plugins/`, in the default profile's order (TaintToleration, NodeAffinity,
NodeResourcesFit: `pkg/scheduler/apis/config/v1/default_plugins.go`); a node's reasons are those
of the first filter that rejects it, as the framework's RunFilterPlugins stops there. A pod is
bound to the first node in profile order that passes (no scoring: deterministic). A pod that
fits nowhere gets the FitError message (`pkg/scheduler/framework/types.go`) and waits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ckptflow.workflows.runner.cluster import CPU, PODS, Cluster, ClusterNode, resource_units
from ckptflow.workflows.runner.gang import Gang, gang_of

__all__ = [
    "PodRequest",
    "add_requests",
    "fit_error",
    "fit_resources",
    "match_node_affinity",
    "node_reasons",
    "pending_message",
    "place",
    "place_gang",
    "pod_request",
    "tolerates",
    "untolerated_taint",
]

# plugins/nodeaffinity/node_affinity.go: ErrReasonPod
AFFINITY_REASON = "node(s) didn't match Pod's node affinity/selector"


@dataclass(frozen=True)
class PodRequest:
    """What the scheduler reads of a pod: its requests and placement constraints."""

    name: str
    requests: dict[str, int]  # resource -> units (cpu in millicores)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict, ...] = ()
    required_terms: tuple[dict, ...] = ()  # nodeAffinity required nodeSelectorTerms (ORed)
    gang: Gang | None = None  # the pod group it must be bound with (gang.py)
    # the order the controller created it in (nodes.py), standing for its creationTimestamp:
    # the scheduling queue's order, not the order its executor's thread happened to ask
    created: int = 0


def _containers(body: dict) -> list[dict]:
    main = body.get("container") or body.get("script")
    return ([main] if isinstance(main, dict) else []) + [
        s for s in body.get("sidecars") or [] if isinstance(s, dict)
    ]


def _requests(body: dict, name: str) -> dict[str, int]:
    """The pod's requests: the sum over its containers (main and sidecars) of each container's
    requests, a resource with only a limit requesting its limit (the API server's defaulting,
    pkg/apis/core/v1/defaults.go SetDefaults_Pod). ValueError on a bad quantity."""
    total: dict[str, int] = {}
    for c in _containers(body):
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for rname, value in merged.items():
            what = f"pod {name}: resources.requests.{rname}"
            total[str(rname)] = total.get(str(rname), 0) + resource_units(str(rname), value, what)
    return total


def pod_request(
    name: str, body: dict, spec: dict | None = None, namespace: str = "default", created: int = 0
) -> PodRequest:
    """The PodRequest of a substituted template `body`: nodeSelector, tolerations and affinity
    its own, else the workflow's (`spec`), as Argo builds the pod (workflow/controller/
    workflowpod.go), its gang (gang.py) and its creation order `created`. ValueError (one
    line) on what the scheduler cannot read."""
    spec = spec or {}
    selector = body.get("nodeSelector") or spec.get("nodeSelector") or {}
    tolerations = body.get("tolerations") or spec.get("tolerations") or []
    affinity = body.get("affinity") or spec.get("affinity") or {}
    if not isinstance(selector, dict) or not isinstance(tolerations, list):
        raise ValueError(f"pod {name}: nodeSelector must be a mapping, tolerations a list")
    if not isinstance(affinity, dict):
        raise ValueError(f"pod {name}: affinity must be a mapping")
    for kind in ("podAffinity", "podAntiAffinity"):
        if (affinity.get(kind) or {}).get("requiredDuringSchedulingIgnoredDuringExecution"):
            raise ValueError(f"pod {name}: required affinity.{kind} is not scheduled locally")
    required = (affinity.get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or [] if isinstance(required, dict) else None
    if not isinstance(terms, list) or not all(isinstance(t, dict) for t in terms):
        raise ValueError(f"pod {name}: nodeAffinity nodeSelectorTerms must be a list of terms")
    try:
        gang = gang_of(body, spec, namespace)
    except ValueError as exc:
        raise ValueError(f"pod {name}: {exc}") from None
    return PodRequest(
        name,
        _requests(body, name),
        {str(k): str(v) for k, v in selector.items()},
        tuple(t for t in tolerations if isinstance(t, dict)),
        tuple(terms),
        gang,
        created,
    )


# --- filters ------------------------------------------------------------------------------------


def tolerates(toleration: dict, taint: dict) -> bool:
    """k8s.io/api/core/v1/toleration.go ToleratesTaint: effect empty matches all; key empty
    with Exists matches every taint; Exists ignores the value, Equal (the default) compares it."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint["effect"]:
        return False
    key, op = toleration.get("key") or "", toleration.get("operator") or "Equal"
    if key and key != taint["key"]:
        return False
    if op == "Exists":
        return True
    return op == "Equal" and key != "" and str(toleration.get("value") or "") == taint["value"]


def untolerated_taint(pod: PodRequest, node: ClusterNode) -> str | None:
    """plugins/tainttoleration/taint_toleration.go Filter: the first NoSchedule/NoExecute taint
    no toleration tolerates (PreferNoSchedule only scores)."""
    for taint in node.taints:
        if taint["effect"] == "PreferNoSchedule":
            continue
        if not any(tolerates(t, taint) for t in pod.tolerations):
            return f"node(s) had untolerated taint {{{taint['key']}: {taint['value']}}}"
    return None


def _number(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _expression(expr: dict, values: dict[str, str]) -> bool:
    """One NodeSelectorRequirement (k8s.io/component-helpers/scheduling/corev1/nodeaffinity):
    In, NotIn, Exists, DoesNotExist, Gt, Lt; an unknown operator matches nothing."""
    key, op = str(expr.get("key") or ""), expr.get("operator")
    wanted = [str(v) for v in expr.get("values") or []]
    have = values.get(key)
    if op == "In":
        return have is not None and have in wanted
    if op == "NotIn":
        return have is None or have not in wanted
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and len(wanted) == 1:
        a, b = _number(have), _number(wanted[0])
        return a is not None and b is not None and (a > b if op == "Gt" else a < b)
    return False


def _term(term: dict, node: ClusterNode) -> bool:
    """A NodeSelectorTerm: all its matchExpressions (labels) and matchFields (metadata.name);
    an empty term matches no node."""
    exprs, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not exprs and not fields:
        return False
    return all(_expression(e, node.labels) for e in exprs) and all(
        _expression(f, {"metadata.name": node.name}) for f in fields
    )


def match_node_affinity(pod: PodRequest, node: ClusterNode) -> str | None:
    """plugins/nodeaffinity/node_affinity.go Filter: nodeSelector labels all equal, and one of
    the required nodeSelectorTerms matches (a node anti-affinity is a NotIn term, as Argo's
    retry_tweak.go writes it)."""
    if any(node.labels.get(k) != v for k, v in pod.node_selector.items()):
        return AFFINITY_REASON
    if pod.required_terms and not any(_term(t, node) for t in pod.required_terms):
        return AFFINITY_REASON
    return None


def fit_resources(pod: PodRequest, node: ClusterNode, used: dict[str, int]) -> list[str]:
    """plugins/noderesources/fit.go fitsRequest: "Too many pods" past the node's pod count,
    then "Insufficient <resource>" for each request above allocatable minus what bound pods use
    (an extended resource the node lacks has 0 allocatable)."""
    reasons = []
    if used.get(PODS, 0) + 1 > node.allocatable.get(PODS, 0):
        reasons.append("Too many pods")
    for rname, want in sorted(pod.requests.items(), key=lambda kv: (kv[0] != CPU, kv[0])):
        if want > 0 and want > node.allocatable.get(rname, 0) - used.get(rname, 0):
            reasons.append(f"Insufficient {rname}")
    return reasons


def node_reasons(pod: PodRequest, node: ClusterNode, used: dict[str, int]) -> list[str]:
    """The reasons `node` does not fit `pod` (empty: it fits), from the first rejecting filter."""
    taint = untolerated_taint(pod, node)
    if taint:
        return [taint]
    affinity = match_node_affinity(pod, node)
    if affinity:
        return [affinity]
    return fit_resources(pod, node, used)


def fit_error(num_nodes: int, reasons: dict[str, list[str]]) -> str:
    """framework/types.go FitError.Error(): "0/N nodes are available: " then each reason's
    count and text ("%v %v"), sorted as strings, joined by ", ", then "."."""
    counts: dict[str, int] = {}
    for node_reasons_ in reasons.values():
        for r in node_reasons_:
            counts[r] = counts.get(r, 0) + 1
    histogram = sorted(f"{v} {k}" for k, v in counts.items())
    return f"0/{num_nodes} nodes are available: {', '.join(histogram)}."


def pending_message(fit: str) -> str:
    """The node message of an unschedulable pod as Argo shows it: the PodScheduled condition's
    reason and message (workflow/controller/operator.go getPendingReason)."""
    return f"Unschedulable: {fit}"


def place(
    cluster: Cluster, pod: PodRequest, used: dict[str, dict[str, int]]
) -> tuple[str | None, str]:
    """(the first node in profile order that fits `pod`, "") or (None, the FitError message)."""
    reasons: dict[str, list[str]] = {}
    for node in cluster.nodes:
        why = node_reasons(pod, node, used.get(node.name, {}))
        if not why:
            return node.name, ""
        reasons[node.name] = why
    return None, fit_error(len(cluster.nodes), reasons)


def add_requests(used: dict[str, int], requests: dict[str, int], sign: int) -> None:
    """Count (`sign` +1) or return (-1) one pod's `requests` and its pod slot in `used`."""
    for rname, units in {**requests, PODS: 1}.items():
        used[rname] = used.get(rname, 0) + sign * units


def place_gang(
    cluster: Cluster, pods: list[PodRequest], used: dict[str, dict[str, int]]
) -> tuple[list[str | None], str]:
    """Where each of `pods` would go if bound one after the other (first fit, each counting the
    ones before it), without binding any: (a node or None per pod, the FitError of the first
    that fits nowhere, or "")."""
    trial = {name: dict(u) for name, u in used.items()}
    nodes: list[str | None] = []
    first = ""
    for pod in pods:
        node, why = place(cluster, pod, trial)
        nodes.append(node)
        if node is None:
            first = first or why
            continue
        add_requests(trial.setdefault(node, {}), pod.requests, +1)
    return nodes, first

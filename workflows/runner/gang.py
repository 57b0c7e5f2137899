"""Gang scheduling: which pods must be bound together, and how many of them (the gang's size).

Three projects mark a pod as one of a gang; each marking is read here as its project documents
it, and nowhere else (the scheduler, `ckptflow check` and the renderer all use these names):

- Kueue plain-pod groups (kubernetes-sigs/kueue `site/content/en/docs/tasks/run/plain_pods.md`,
  `pkg/controller/jobs/pod/constants/constants.go`): the label `kueue.x-k8s.io/queue-name` (the
  LocalQueue; without it Kueue leaves the pod alone), the label `kueue.x-k8s.io/pod-group-name`
  and the annotation `kueue.x-k8s.io/pod-group-total-count`. Kueue admits the group's Workload
  as a whole, once all total-count pods exist, and only then lifts their scheduling gate
  (`kueue.x-k8s.io/admission`). The webhook refuses a group name without the count, and a count
  that is not a whole number above zero (`pod_webhook.go` validatePodGroupMetadata,
  `pod_controller.go` groupTotalCount).
- Volcano (volcano-sh/volcano `staging/src/volcano.sh/apis/pkg/apis/scheduling/v1beta1/
  labels.go` KubeGroupNameAnnotationKey; `pkg/scheduler/plugins/gang/gang.go`): a pod that
  Volcano schedules (`schedulerName`, `volcano` by default; the default scheduler ignores the
  annotation) with the annotation `scheduling.k8s.io/group-name` naming a
  `scheduling.volcano.sh/v1beta1` PodGroup; no task of the job is allocated until
  `spec.minMember` of them can be (JobReady).
- scheduler-plugins coscheduling (kubernetes-sigs/scheduler-plugins `pkg/coscheduling/core/
  core.go`, `apis/scheduling/v1alpha1/types.go` PodGroupLabel): the label
  `scheduling.x-k8s.io/pod-group` naming a `scheduling.x-k8s.io/v1alpha1` PodGroup; Permit holds
  every assigned pod until `minMember` of the group are assigned, and a pod whose PodGroup does
  not exist is denied ("PodGroup not found"). The plugin runs in whichever scheduler profile
  enables it (its second scheduler is `scheduler-plugins-scheduler`, or the default one), so
  the label alone marks the pod.

A PodGroup is read from the run's object store (objects.py): a `resource` template creates it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptflow.workflows.runner.cluster import CPU, MEMORY

__all__ = [
    "COSCHEDULING",
    "KUEUE",
    "SCHEDULERS",
    "VOLCANO",
    "Gang",
    "gang_message",
    "gang_of",
    "pod_group_size",
    "podgroup_min_member",
]

KUEUE, VOLCANO, COSCHEDULING = "kueue", "volcano", "coscheduling"
SCHEDULERS = (KUEUE, VOLCANO, COSCHEDULING)

# kueue pkg/controller/jobs/pod/constants/constants.go; pkg/constants (QueueLabel)
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
# volcano .../scheduling/v1beta1/labels.go KubeGroupNameAnnotationKey; its scheduler's name
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_SCHEDULER = "volcano"
VOLCANO_API = "scheduling.volcano.sh/v1beta1"
# scheduler-plugins apis/scheduling/v1alpha1 PodGroupLabel; the chart's scheduler.name
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
COSCHEDULING_SCHEDULER = "scheduler-plugins-scheduler"
COSCHEDULING_API = "scheduling.x-k8s.io/v1alpha1"
PODGROUP_API = {VOLCANO: VOLCANO_API, COSCHEDULING: COSCHEDULING_API}
DEFAULT_SCHEDULER = "default-scheduler"  # pkg/apis/core/v1 defaults: an empty schedulerName
MAX_GANG = 100_000  # a bound on a gang's size read from a manifest (hostile numbers)


@dataclass(frozen=True)
class Gang:
    """A pod group: its scheduler, name and namespace, and its size when the pod says it
    (Kueue's total count); None: the PodGroup's minMember says it."""

    scheduler: str  # kueue | volcano | coscheduling
    name: str
    namespace: str
    size: int | None = None

    @property
    def key(self) -> str:
        return f"{self.scheduler}:{self.namespace}/{self.name}"

    def __str__(self) -> str:
        return f"{self.scheduler} pod group {self.namespace}/{self.name}"


def _count(text, what: str) -> int:
    """A whole number of pods from 1 to MAX_GANG (Kueue: strconv.Atoi and > 0); ValueError."""
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(f"{what} {str(text)[:40]!r} is not a whole number") from None
    if not 1 <= value <= MAX_GANG:
        raise ValueError(f"{what} {value} is not between 1 and {MAX_GANG}")
    return value


def _metadata(body: dict) -> tuple[dict, dict]:
    meta = body.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    if not isinstance(labels, dict) or not isinstance(annotations, dict):
        raise ValueError("metadata.labels and metadata.annotations must be mappings")
    return labels, annotations


def gang_of(body: dict, spec: dict | None = None, namespace: str = "default") -> Gang | None:
    """The gang the pod of template `body` (workflow spec `spec`) belongs to, or None. Argo puts
    a template's `metadata` and its (else the workflow's) `schedulerName` on the pod
    (workflow/controller/workflowpod.go). ValueError (one line) on a marking the project's own
    admission would refuse."""
    labels, annotations = _metadata(body)
    kueue = labels.get(KUEUE_GROUP_LABEL)
    if kueue is not None and labels.get(KUEUE_QUEUE_LABEL) is not None:
        if KUEUE_COUNT_ANNOTATION not in annotations:
            raise ValueError(
                f"label {KUEUE_GROUP_LABEL} needs the annotation {KUEUE_COUNT_ANNOTATION}"
            )
        size = _count(annotations[KUEUE_COUNT_ANNOTATION], KUEUE_COUNT_ANNOTATION)
        return Gang(KUEUE, str(kueue), namespace, size)
    scheduler = str(body.get("schedulerName") or (spec or {}).get("schedulerName") or "")
    volcano = annotations.get(VOLCANO_GROUP_ANNOTATION)
    if volcano is not None and scheduler not in ("", DEFAULT_SCHEDULER):
        return Gang(VOLCANO, str(volcano), namespace)
    cosched = labels.get(COSCHEDULING_GROUP_LABEL)
    if cosched is not None:
        return Gang(COSCHEDULING, str(cosched), namespace)
    return None


def podgroup_min_member(obj: dict, what: str) -> int:
    """`spec.minMember` of a PodGroup object; ValueError (one line naming `what`) when it is
    not a whole number of pods. Volcano allows 0 (no gang: each pod alone)."""
    value = (obj.get("spec") or {}).get("minMember", 0)
    # an int32 field: the API server refuses a string ("4") or a fraction
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what}: spec.minMember {str(value)[:40]!r} is not a whole number")
    return 0 if value == 0 else _count(value, f"{what}: spec.minMember")


def pod_group_size(gang: Gang, objects) -> tuple[int | None, str]:
    """(the gang's size, "") or (None, why it is not known yet). Kueue's is on the pod; Volcano's
    and coscheduling's is the minMember of their PodGroup in the object store `objects`
    (a PodGroup of the other project's API group is not theirs). A pod whose PodGroup is missing
    waits, as both schedulers leave it Pending."""
    if gang.size is not None:
        return gang.size, ""
    obj = objects.get("PodGroup", gang.name, gang.namespace) if objects is not None else None
    api = PODGROUP_API[gang.scheduler]
    if obj is None or obj.get("apiVersion") != api:
        return None, f"{gang}: PodGroup not found ({api} PodGroup {gang.name!r})"
    try:
        return podgroup_min_member(obj, f"PodGroup {gang.namespace}/{gang.name}"), ""
    except ValueError as exc:
        return None, str(exc)


def _quantity(rname: str, units: int) -> str:
    """Units as a Kubernetes quantity: cpu in cores or millicores, memory in Gi/Mi/Ki."""
    if rname == CPU:
        return str(units // 1000) if units % 1000 == 0 else f"{units}m"
    if rname == MEMORY:
        for suffix, size in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
            if units and units % size == 0:
                return f"{units // size}{suffix}"
    return str(units)


def gang_message(
    gang: Gang, size: int, fit: int, requests: dict[str, int], fit_now: str, empty: int
) -> str:
    """One line: the gang, how many of its `size` pods fit (`fit` now, `empty` on an empty
    cluster: fewer means it never fits), the capacity missing (the pods short, each with its
    requests) and the FitError of the first pod that fits nowhere."""
    short = size - fit
    each = ", ".join(f"{k} {_quantity(k, v)}" for k, v in sorted(requests.items()) if v)
    never = f"; it never fits: the empty cluster holds {empty}" if empty < size else ""
    return (
        f"{gang}: {size} pods must be bound together, {fit} fit now{never}; missing capacity "
        f"for {short} pod(s) of {each or 'no requests'}: {fit_now}"
    )

"""Gang scheduling of the pretraining ranks (`platform.gang_scheduler`), rendered on the rank pods
only, as each project documents it (the names come from runner/gang.py, which reads them back):

- `kueue`: Kueue plain-pod groups (kubernetes-sigs/kueue `site/content/en/docs/tasks/run/
  plain_pods.md`, "Running a group of Pods to be admitted together", and `external_workloads/
  argo_workflow.md`: the queue on `spec.templates[].metadata`): labels
  `kueue.x-k8s.io/queue-name` (the LocalQueue, `platform.gang_queue`) and
  `kueue.x-k8s.io/pod-group-name`, annotation `kueue.x-k8s.io/pod-group-total-count` = ranks.
  Kueue makes the group's Workload itself: no PodGroup.
- `volcano`: `schedulerName: volcano` and the annotation `scheduling.k8s.io/group-name`
  (volcano-sh/volcano `.../scheduling/v1beta1/labels.go`), and a `scheduling.volcano.sh/v1beta1`
  PodGroup with `minMember` = ranks in `spec.queue` (`platform.gang_queue`, Volcano's `default`).
- `coscheduling`: scheduler-plugins' label `scheduling.x-k8s.io/pod-group`, its second
  scheduler's name (`scheduler-plugins-scheduler`, manifests/install/charts/as-a-second-scheduler)
  and a `scheduling.x-k8s.io/v1alpha1` PodGroup with `minMember` = ranks (pkg/coscheduling/README).

Each group is named after the workflow (`{{workflow.name}}`), one per run. The PodGroup is made by
a `resource` template that the ranks depend on, with `setOwnerReference: true`: Argo makes the
Workflow its owner, so Kubernetes' garbage collector deletes it with the Workflow (its TTL, or
`argo delete`), whatever the run's outcome, also a terminated run whose exit handler never runs.
A PodGroup whose pods are gone holds nothing (no minResources), so it may outlive the run's end.
"""

from __future__ import annotations

from ckptflow.workflows.checks import ConfigError
from ckptflow.workflows.runner import gang as rules
from hera.workflows import Resource

__all__ = ["GANG_SCHEDULERS", "NONE", "check_gang", "mark_ranks", "podgroup_template"]

NONE = "none"
GANG_SCHEDULERS = (NONE, *rules.SCHEDULERS)
GROUP = "{{workflow.name}}"  # one group per run
TEMPLATE = "rank-podgroup"
DEFAULT_QUEUE = {rules.KUEUE: "ckptflow", rules.VOLCANO: "default"}  # deploy/gang/kueue's
DEFAULT_SCHEDULER = {
    rules.VOLCANO: rules.VOLCANO_SCHEDULER,
    rules.COSCHEDULING: rules.COSCHEDULING_SCHEDULER,
}
# what the gang setting writes on the rank pods, by kind (user labels/annotations must not clash)
OWN_LABELS = (rules.KUEUE_QUEUE_LABEL, rules.KUEUE_GROUP_LABEL, rules.COSCHEDULING_GROUP_LABEL)
OWN_ANNOTATIONS = (rules.KUEUE_COUNT_ANNOTATION, rules.VOLCANO_GROUP_ANNOTATION)


def _queue(platform) -> str:
    return platform.gang_queue or DEFAULT_QUEUE.get(platform.gang_scheduler, "")


def check_gang(platform) -> None:
    """ConfigError (one line naming the setting) for gang settings that do not go together."""
    kind = platform.gang_scheduler
    if platform.gang_queue and kind not in DEFAULT_QUEUE:
        raise ConfigError(
            f"--set platform.gang_queue={platform.gang_queue}: platform.gang_scheduler={kind} "
            "has no queue (kueue: a LocalQueue, volcano: a Queue)"
        )
    if platform.gang_scheduler_name and kind not in DEFAULT_SCHEDULER:
        raise ConfigError(
            f"--set platform.gang_scheduler_name={platform.gang_scheduler_name}: only volcano "
            f"and coscheduling name the ranks' scheduler (platform.gang_scheduler={kind})"
        )
    if kind == NONE:
        return
    for key, pairs, own in (
        ("platform.gpu_pod_labels", platform.gpu_pod_labels, OWN_LABELS),
        ("platform.gpu_pod_annotations", platform.gpu_pod_annotations, OWN_ANNOTATIONS),
    ):
        for name, value in pairs:
            if name in own:
                raise ConfigError(
                    f"--set {key}={name}={value}: {name} is written by "
                    f"platform.gang_scheduler={kind}; leave it out"
                )


def mark_ranks(rank, platform, ranks: str) -> None:
    """Put the gang's labels, annotations and scheduler name on the rank template (a hera
    Container) of a fan-out of `ranks` pods (the parameter's expression); nothing for `none`."""
    kind = platform.gang_scheduler
    labels, annotations = {}, {}
    if kind == rules.KUEUE:
        labels = {rules.KUEUE_QUEUE_LABEL: _queue(platform), rules.KUEUE_GROUP_LABEL: GROUP}
        annotations = {rules.KUEUE_COUNT_ANNOTATION: ranks}
    elif kind == rules.VOLCANO:
        annotations = {rules.VOLCANO_GROUP_ANNOTATION: GROUP}
    elif kind == rules.COSCHEDULING:
        labels = {rules.COSCHEDULING_GROUP_LABEL: GROUP}
    else:
        return
    if labels:
        rank.labels = {**(rank.labels or {}), **labels}
    if annotations:
        rank.annotations = {**(rank.annotations or {}), **annotations}
    if kind in DEFAULT_SCHEDULER:
        rank.scheduler_name = platform.gang_scheduler_name or DEFAULT_SCHEDULER[kind]


def podgroup_manifest(platform, ranks: str) -> str | None:
    """The run's PodGroup (Volcano, coscheduling) as the resource template's manifest text;
    minMember is `ranks` (the parameter's expression, substituted by Argo before the text is
    parsed)."""
    kind = platform.gang_scheduler
    if kind not in rules.PODGROUP_API:
        return None
    lines = [
        f"apiVersion: {rules.PODGROUP_API[kind]}",
        "kind: PodGroup",
        "metadata:",
        f'  name: "{GROUP}"',
        "spec:",
        f"  minMember: {ranks}",  # an int32: unquoted
    ]
    if kind == rules.VOLCANO:
        lines.append(f"  queue: {_queue(platform)}")
    return "\n".join(lines) + "\n"


def podgroup_template(platform, ranks: str) -> Resource | None:
    """The resource template creating the run's PodGroup of `ranks` pods (None: the scheduler
    needs none). Must be called inside a hera Workflow context, which collects it."""
    manifest = podgroup_manifest(platform, ranks)
    if manifest is None:
        return None
    # apply, not create: a retried or re-run task finds its PodGroup there and succeeds
    return Resource(name=TEMPLATE, action="apply", manifest=manifest, set_owner_reference=True)

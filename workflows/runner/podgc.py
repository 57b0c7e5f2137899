"""podGC: which pods Argo deletes, and when (workflow/controller/pod/cleanup.go
determinePodCleanupAction; workflow/validate/validate.go checks the strategy).

A deleted pod takes its logs with it: `argo logs` and `kubectl logs` fail for it unless the
artifact repository archives logs. The runner deletes nothing (its log files stay for you to
read) but marks each node whose pod Argo would have deleted by now, `local.podDeleted: true` in
the status, so what you can inspect here says what you could not on the cluster. A podGC it
cannot evaluate is refused with one line.
"""

from __future__ import annotations

from ckptflow.workflows.runner.substitution import parse_duration

__all__ = ["STRATEGIES", "mark_deleted", "pod_deleted", "problems"]

# wfv1.PodGCStrategy IsValid: "" (none) and the four strategies
STRATEGIES = ("", "OnPodCompletion", "OnPodSuccess", "OnWorkflowCompletion", "OnWorkflowSuccess")
_COMPLETED = ("Succeeded", "Failed", "Error")  # WorkflowPhase.Completed()
_OK = {"strategy", "labelSelector", "deleteDelayDuration"}


def problems(spec: dict) -> list[tuple[str, str]]:
    """(field, why) for each part of `spec.podGC` Argo would refuse or the runner cannot read."""
    gc = spec.get("podGC")
    if gc is None:
        return []
    if not isinstance(gc, dict):
        return [("podGC", "expected a mapping")]
    out = [(f"podGC.{k}", "not supported by the local runner") for k in gc if k not in _OK]
    strategy = gc.get("strategy") or ""
    if strategy not in STRATEGIES:
        out.append(("podGC.strategy", f"unknown strategy '{strategy}'"))  # validate.go
    selector = gc.get("labelSelector")
    if selector is not None:
        if not isinstance(selector, dict) or set(selector) - {"matchLabels"}:
            out.append(("podGC.labelSelector", "only matchLabels is evaluated locally"))
        elif not isinstance(selector.get("matchLabels") or {}, dict):
            out.append(("podGC.labelSelector.matchLabels", "expected a mapping"))
    if gc.get("deleteDelayDuration") is not None:
        try:
            parse_duration(gc["deleteDelayDuration"])
        except ValueError as exc:
            out.append(("podGC.deleteDelayDuration", str(exc)))
    return out


def pod_deleted(
    strategy: str, selector: dict[str, str], labels: dict[str, str], wf_phase: str, pod_phase: str
) -> bool:
    """Whether Argo deletes a pod that has ended in `pod_phase` while the workflow is in
    `wf_phase` (cleanup.go determinePodCleanupAction: a pod the selector does not match, or
    strategy none, is only labelled completed, never deleted)."""
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    if strategy == "OnWorkflowCompletion":
        return wf_phase in _COMPLETED
    if strategy == "OnWorkflowSuccess":
        return wf_phase == "Succeeded"
    if strategy == "OnPodCompletion":
        return True
    if strategy == "OnPodSuccess":
        return pod_phase == "Succeeded"
    return False


def _labels(spec: dict, templates: dict[str, dict], name: str | None) -> dict[str, str]:
    """A pod's labels as Argo sets them: the workflow's podMetadata, then its template's."""
    tmpl = templates.get(name or "") or {}
    out = dict((spec.get("podMetadata") or {}).get("labels") or {})
    out.update((tmpl.get("metadata") or {}).get("labels") or {})
    return {str(k): str(v) for k, v in out.items()}


def mark_deleted(spec: dict, templates: dict[str, dict], nodes: dict, wf_phase: str) -> int:
    """Mark (`local.podDeleted`) each ended Pod node of the status `nodes` whose pod Argo would
    have deleted by now; how many."""
    gc = spec.get("podGC") or {}
    strategy = gc.get("strategy") or ""
    selector = {
        str(k): str(v)
        for k, v in ((gc.get("labelSelector") or {}).get("matchLabels") or {}).items()
    }
    marked = 0
    for node in nodes.values():
        if node.get("type") != "Pod" or node.get("phase") not in _COMPLETED:
            continue
        labels = _labels(spec, templates, node.get("templateName"))
        if pod_deleted(strategy, selector, labels, wf_phase, node["phase"]):
            node.setdefault("local", {})["podDeleted"] = True
            marked += 1
    return marked

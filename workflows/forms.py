"""The forms a parameterized workflow takes: a Workflow, a WorkflowTemplate, and a Workflow that
runs an installed WorkflowTemplate (`workflowTemplateRef`) with its own parameter values.

A platform team installs the template once (`ckptflow submit pipeline --template`, or
`ckptflow render pipeline --template | kubectl apply -f -`); each run is then a small Workflow
naming it and the parameters that differ (`ckptflow submit pipeline --from-template -p
ranks=4`, or `argo submit --from workflowtemplate/ckptflow-pipeline -p ranks=4`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

from ckptflow.workflows import parameters
from ckptflow.workflows.config import ConfigError, PipelineConfig
from ckptflow.workflows.staged_workflow import labels

__all__ = [
    "FORMS",
    "KNOBS",
    "check_values",
    "from_template",
    "template",
    "template_name",
    "with_values",
]

FORMS = ("workflow", "template", "from-template")
# The workflows whose knobs are workflow parameters, and which parameters they take.
KNOBS = {
    "pipeline": parameters.PIPELINE,
    "pretrain": parameters.PRETRAIN,
    "finetune": parameters.FINETUNE,
}
EXTRA = {"finetune": (parameters.BASE_ROOT,)}  # parameters with no --set default


def template_name(name: str, cfg: PipelineConfig) -> str:
    """The WorkflowTemplate's name: `<name prefix>-<workflow>` (ckptflow-pipeline)."""
    return f"{cfg.name}-{name}"


def check_values(name: str, cfg: PipelineConfig, values: Mapping[str, str]) -> None:
    """ConfigError (one line) for a `-p` that workflow `name` has not, or a bad value."""
    if values and name not in KNOBS:
        raise ConfigError(f"-p: {name} takes no workflow parameters (use --set)")
    if values:
        parameters.check_values(cfg, KNOBS[name], values, extra=EXTRA.get(name, ()))


def with_values(doc: dict, values: Mapping[str, str]) -> dict:
    """A Workflow/WorkflowTemplate manifest with its parameters' values replaced by `values`."""
    doc = copy.deepcopy(doc)
    for p in doc["spec"].get("arguments", {}).get("parameters", []):
        if p["name"] in values:
            p["value"] = values[p["name"]]
    return doc


def template(name: str, doc: dict, cfg: PipelineConfig) -> dict:
    """The rendered Workflow `doc` as a WorkflowTemplate (a fixed name instead of generateName)."""
    if name == "evaluate":
        raise ConfigError(
            "--template: evaluate renders a WorkflowTemplate already; drop --template"
        )
    if name not in KNOBS:
        raise ConfigError(
            f"--template: choose one of {', '.join(KNOBS)} ({name} has no template form)"
        )
    doc = copy.deepcopy(doc)
    doc["kind"] = "WorkflowTemplate"
    meta = doc["metadata"]
    meta.pop("generateName", None)
    doc["metadata"] = {"name": template_name(name, cfg), **meta}
    return doc


def from_template(name: str, cfg: PipelineConfig, values: Mapping[str, str]) -> dict:
    """A Workflow running the installed WorkflowTemplate of `name` with `values` (the others:
    the template's defaults)."""
    if name not in KNOBS:
        raise ConfigError(f"--from-template: choose one of {', '.join(KNOBS)}")
    prefix = cfg.name if name == "pipeline" else f"{cfg.name}-{name}"
    spec: dict = {"workflowTemplateRef": {"name": template_name(name, cfg)}}
    if values:
        spec["arguments"] = {"parameters": [{"name": k, "value": v} for k, v in values.items()]}
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {
            "generateName": f"{prefix}-",
            "namespace": cfg.platform.namespace,
            "labels": labels(cfg),
        },
        "spec": spec,
    }

"""What the rendered pipeline needs to pass Argo's and Kubernetes' rules on a real cluster
(issue 33): no default retry affinity, an evaluator that is not a daemon that exits, no default
deadline (per-run timeouts as workflow parameters), and pods that pass the `restricted` Pod
Security Standard."""

from __future__ import annotations

import pytest
from ckptflow.workflows.config import ConfigError, PipelineConfig, apply_overrides
from ckptflow.workflows.parameters import PIPELINE, check_values
from ckptflow.workflows.render import BUILDER_NAMES, manifests

RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def render(name: str, *overrides: str) -> list[dict]:
    return manifests(name, apply_overrides(PipelineConfig(), overrides))


def workflow_specs(docs: list[dict]) -> list[dict]:
    out = []
    for doc in docs:
        spec = doc.get("spec") or {}
        spec = spec.get("workflowSpec", spec)
        if "templates" in spec:
            out.append(spec)
    return out


def templates(doc: dict) -> dict[str, dict]:
    spec = doc["spec"].get("workflowSpec", doc["spec"])
    return {t["name"]: t for t in spec["templates"]}


def pod_templates(docs: list[dict]) -> list[dict]:
    return [
        t
        for spec in workflow_specs(docs)
        for t in spec["templates"]
        if "container" in t or "script" in t
    ]


def test_no_template_retries_with_node_anti_affinity_by_default():
    for name in BUILDER_NAMES:
        for t in pod_templates(render(name)):
            assert "affinity" not in (t.get("retryStrategy") or {}), (name, t["name"])


def test_retry_elsewhere_is_an_opt_in_setting():
    doc = render("pipeline", "pretrain.retry_elsewhere=true", "finetune.retry_elsewhere=true")
    tpl = templates(doc[0])
    for name in ("pretrain-rank", "finetune-variant"):
        assert tpl[name]["retryStrategy"]["affinity"] == {"nodeAntiAffinity": {}}, name
    assert "affinity" not in tpl["evaluate-final"]["retryStrategy"]


def test_no_deadline_by_default():
    for name in BUILDER_NAMES:
        if name in ("retention", "evaluate"):
            continue  # one gc pass, one checkpoint's evaluation: bounded (their deadline_s)
        docs = render(name)
        for spec in workflow_specs(docs):
            assert "activeDeadlineSeconds" not in spec, name
        for t in pod_templates(docs):
            assert "activeDeadlineSeconds" not in t, (name, t["name"])


def test_training_and_evaluator_timeouts_are_workflow_parameters():
    doc = render("pipeline")[0]
    tpl = templates(doc)
    params = {p["name"]: p.get("value") for p in doc["spec"]["arguments"]["parameters"]}
    assert tpl["pretrain-rank"]["timeout"] == "{{workflow.parameters.pretrain_timeout}}"
    assert tpl["finetune-variant"]["timeout"] == "{{workflow.parameters.finetune_timeout}}"
    for name in ("evaluate-background", "evaluate-final"):
        assert tpl[name]["timeout"] == "{{workflow.parameters.evaluator_timeout}}"
    assert params["pretrain_timeout"] == params["evaluator_timeout"] == ""
    assert params["finetune_timeout"] == ""
    set_ = render("pipeline", "pretrain.timeout=120h", "platform.workflow_deadline_s=600")[0]
    assert {p["name"]: p.get("value") for p in set_["spec"]["arguments"]["parameters"]}[
        "pretrain_timeout"
    ] == "120h"
    assert set_["spec"]["activeDeadlineSeconds"] == 600


@pytest.mark.parametrize("value", ["120h", "90m", "3600", ""])
def test_a_timeout_parameter_takes_a_go_duration(value):
    check_values(PipelineConfig(), PIPELINE, {"pretrain_timeout": value})


@pytest.mark.parametrize("value", ["5d", "soon", "-1h"])
def test_a_timeout_argo_cannot_parse_is_refused_in_one_line(value):
    with pytest.raises(ConfigError) as err:
        check_values(PipelineConfig(), PIPELINE, {"pretrain_timeout": value})
    assert "\n" not in str(err.value) and "120h" in str(err.value)


def test_the_background_evaluator_is_a_daemon_that_never_exits():
    """Argo fails a daemon whose pod succeeds (operator.go): the background evaluator follows
    the run until its DAG stops it; the final evaluator (a regular task) ends the run's
    evaluations once training has FINISHED."""
    tpl = templates(render("pipeline")[0])
    background, final = tpl["evaluate-background"], tpl["evaluate-final"]
    assert background["daemon"] is True
    assert "--forever" in background["container"]["args"]
    assert "--until-finished" not in background["container"]["args"]
    assert "daemon" not in final and "--until-finished" in final["container"]["args"]


def test_every_pod_passes_the_restricted_pod_security_standard():
    for name in BUILDER_NAMES:
        for t in pod_templates(render(name)):
            body = t.get("container") or t.get("script")
            assert body.get("securityContext") == RESTRICTED, (name, t["name"])
            for vol in t.get("volumes") or []:
                assert "hostPath" not in vol, (name, t["name"])

"""Event-driven evaluation: the Sensor turns a MinIO commit-marker key into run root + step.

The Sensor's parameters are Go templates (sprig functions). `_go_pipeline` evaluates the
small subset they use (`{{ X | f "arg" | g }}` with dir, base, trimSuffix, trimPrefix, atoi,
and field access into the event), with Go's semantics for each function, so the test runs
the rendered strings themselves on a real MinIO notification payload.
"""

from __future__ import annotations

import posixpath
import re
import shlex

import pytest
from ckptflow.workflows.config import ConfigError, PipelineConfig, apply_overrides
from ckptflow.workflows.evaluate_template import event_source, sensor

# A MinIO bucket notification as Argo Events' minio event source delivers it.
EVENT = {
    "notification": [
        {
            "eventName": "s3:ObjectCreated:Put",
            "s3": {
                "bucket": {"name": "ckptflow"},
                "object": {"key": "runs/ckptflow-x7k2p/pretrain/ckpt/step-00000120/COMMIT"},
            },
        }
    ]
}

_FUNCS = {
    "dir": lambda s: posixpath.dirname(s) or ".",  # Go path.Dir
    "base": posixpath.basename,
    "atoi": lambda s: str(int(s)),
    "trimSuffix": lambda suffix, s: s[: -len(suffix)] if suffix and s.endswith(suffix) else s,
    "trimPrefix": lambda prefix, s: s[len(prefix) :] if s.startswith(prefix) else s,
}


def _lookup(expr: str, data: dict) -> str:
    m = re.fullmatch(r"\(index \.Input\.(\w+) (\d+)\)((?:\.\w+)*)", expr.strip())
    assert m, f"unsupported expression {expr!r}"
    value = data[m.group(1)][int(m.group(2))]
    for key in m.group(3).strip(".").split("."):
        value = value[key]
    return value


def _go_pipeline(template: str, data: dict) -> str:
    def action(m: re.Match) -> str:
        first, *calls = m.group(1).split("|")
        value = _lookup(first, data)
        for call in calls:
            name, *args = shlex.split(call)
            value = _FUNCS[name](*args, value)
        return value

    return re.sub(r"\{\{(.*?)\}\}", action, template)


def _arguments(cfg: PipelineConfig, event: dict) -> dict[str, str]:
    trigger = sensor(cfg)["spec"]["triggers"][0]["template"]["argoWorkflow"]
    wf = trigger["source"]["resource"]
    names = [p["name"] for p in wf["spec"]["arguments"]["parameters"]]
    out = {}
    for p in trigger["parameters"]:
        index = int(p["dest"].rsplit(".", 2)[-2])
        out[names[index]] = _go_pipeline(p["src"]["dataTemplate"], event)
    return out


def test_commit_key_becomes_run_root_and_step():
    args = _arguments(PipelineConfig(), EVENT)
    assert args == {"run_root": "s3://ckptflow/runs/ckptflow-x7k2p/pretrain", "step": "120"}


def test_finetune_variant_commit_too():
    event = {"notification": [dict(EVENT["notification"][0])]}
    key = "runs/wf/finetune/lr0.001-freeze1/ckpt/step-00001000/COMMIT"
    event["notification"][0]["s3"] = {"bucket": {"name": "other"}, "object": {"key": key}}
    assert _arguments(PipelineConfig(), event) == {
        "run_root": "s3://other/runs/wf/finetune/lr0.001-freeze1",
        "step": "1000",
    }


def test_event_source_filters_commit_markers_under_the_storage_prefix():
    cfg = apply_overrides(
        PipelineConfig(),
        ["platform.storage_root=s3://lake/team/runs", "platform.s3_endpoint=http://minio:9000"],
    )
    minio = event_source(cfg)["spec"]["minio"]["checkpoint-commits"]
    assert minio["bucket"] == {"name": "lake"}
    assert minio["endpoint"] == "minio:9000"
    assert minio["filter"] == {"prefix": "team/runs/", "suffix": "/COMMIT"}
    wf = sensor(cfg)["spec"]["triggers"][0]["template"]["argoWorkflow"]["source"]["resource"]
    assert wf["spec"]["workflowTemplateRef"] == {"name": "ckptflow-evaluate"}


def test_event_source_needs_s3_storage():
    cfg = apply_overrides(PipelineConfig(), ["platform.storage_root=/data/runs"])
    with pytest.raises(ConfigError, match="s3:// storage root"):
        event_source(cfg)

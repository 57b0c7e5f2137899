"""The retention CronWorkflow finds its roots (issue 33 point 7): by default it collects every
checkpoint root the pipelines write under the storage root (`NAME/pretrain/ckpt`,
`NAME/finetune/VARIANT/ckpt`), found at run time by `ckptflow ckpt roots`; a storage root with
none fails the run rather than succeeding with nothing done."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.workflows.config import PipelineConfig, apply_overrides
from ckptflow.workflows.render import manifests
from ckptflow.workflows.runner import run_workflow

from ckptflow.core import rootreader
from ckptflow.core.storage import Storage

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def render(*overrides: str) -> dict:
    return manifests("retention", apply_overrides(PipelineConfig(), overrides))[0]


def templates(doc: dict) -> dict[str, dict]:
    return {t["name"]: t for t in doc["spec"]["workflowSpec"]["templates"]}


def test_by_default_the_roots_are_found_under_the_storage_root():
    doc = render("platform.storage_root=s3://bucket/runs")
    tpl = templates(doc)
    find = tpl["find-roots"]["container"]
    assert find["command"] == ["python", "-m", "ckptflow.cli"]
    assert find["args"] == ["ckpt", "roots", "s3://bucket/runs", "--json"]
    tasks = {t["name"]: t for t in tpl["main"]["dag"]["tasks"]}
    assert tasks["root"]["withParam"] == "{{tasks.find-roots.outputs.result}}"
    assert tasks["root"]["depends"] == "find-roots"
    assert "s3://bucket/runs" in doc["metadata"]["annotations"]["workflows.argoproj.io/description"]


def test_named_roots_are_collected_as_given():
    doc = render("retention.roots=s3://b/r1/ckpt,s3://b/r2/ckpt")
    tpl = templates(doc)
    assert "find-roots" not in tpl
    tasks = {t["name"]: t for t in tpl["main"]["dag"]["tasks"]}
    assert tasks["root"]["withItems"] == ["s3://b/r1/ckpt", "s3://b/r2/ckpt"]


def _run(runs: Path, tmp_path: Path, name: str):
    doc = render(
        f"platform.storage_root={runs}",
        "platform.s3_secret=",
        "platform.s3_endpoint=",
        "retention.drill_newest=1",
        "retention.drill_test_load=false",
        "retention.policy=last=1",
    )
    return run_workflow(doc, workdir=str(tmp_path / name), name=name, stream=io.StringIO())


def test_the_cron_workflow_collects_every_run_root_and_fails_on_none(tmp_path):
    runs = tmp_path / "runs"
    roots = [runs / "wf-a" / "pretrain" / "ckpt", runs / "wf-a" / "finetune" / "v1" / "ckpt"]
    for root in roots:
        ck = Checkpointer(str(root))
        for step in (1, 2):
            ck.save(step, {"w": torch.full((4,), float(step))})
        ck.close()
    result = _run(runs, tmp_path, "ret")
    assert result.phase == "Succeeded", result.table
    for root in roots:  # last=1: each root collected down to its latest step
        assert rootreader.committed_steps(Storage(str(root))) == [2]
    (tmp_path / "empty").mkdir()
    empty = _run(tmp_path / "empty", tmp_path, "ret-empty")
    assert empty.phase == "Failed"
    assert empty.node("find-roots")["phase"] == "Failed"

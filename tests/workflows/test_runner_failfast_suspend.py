"""Steps `failFast` (workflow/controller/operator.go checkParallelism), suspend templates with
a duration (operator.go executeSuspend) and the template fields accepted as no-ops, on small
manifests."""

from __future__ import annotations

import io
import time

import pytest
from ckptflow.workflows.runner import SpecError, run_workflow
from ckptflow.workflows.runner.steps_exec import FAIL_FAST


def _run(spec: dict, tmp_path, **kw):
    return run_workflow(
        {"metadata": {"name": "wf"}, "spec": spec}, workdir=str(tmp_path / "w"),
        stream=io.StringIO(), **kw,
    )  # fmt: skip


def _loop(fail_fast: bool | None) -> dict:
    main = {
        "name": "main",
        "parallelism": 1,
        "steps": [
            [{"name": "u", "template": "u", "withItems": [0, 0, 1, 0, 0],
              "arguments": {"parameters": [{"name": "code", "value": "{{item}}"}]}}]
        ],
    }  # fmt: skip
    if fail_fast is not None:
        main["failFast"] = fail_fast
    unit = {
        "name": "u",
        "inputs": {"parameters": [{"name": "code"}]},
        "container": {"command": ["sh", "-c", "exit {{inputs.parameters.code}}"]},
    }
    return {"entrypoint": "main", "templates": [main, unit]}


def _pods(result) -> list[str]:
    return sorted(n["phase"] for n in result.nodes.values() if n["type"] == "Pod")


def test_fail_fast_starts_no_step_after_a_failed_one(tmp_path):
    result = _run(_loop(True), tmp_path)
    assert result.phase == "Failed"
    assert result.message == FAIL_FAST
    assert _pods(result) == ["Failed", "Succeeded", "Succeeded"]  # items 4 and 5 never ran
    group = next(n for n in result.nodes.values() if n["type"] == "StepGroup")
    assert group["phase"] == "Failed" and group["message"] == FAIL_FAST


def test_without_fail_fast_every_item_runs(tmp_path):
    result = _run(_loop(None), tmp_path)
    assert result.phase == "Failed"
    assert _pods(result) == ["Failed", "Succeeded", "Succeeded", "Succeeded", "Succeeded"]


def test_fail_fast_on_a_dag_template_is_refused_naming_dag_fail_fast(tmp_path):
    spec = {
        "entrypoint": "d",
        "templates": [
            {"name": "d", "failFast": True, "dag": {"tasks": [{"name": "a", "template": "e"}]}},
            {"name": "e", "container": {"command": ["true"]}},
        ],
    }
    with pytest.raises(SpecError, match="on a DAG use dag.failFast"):
        _run(spec, tmp_path)


def _suspending(suspend: dict, outputs: dict | None = None) -> dict:
    wait = {"name": "wait", "suspend": suspend}
    if outputs:
        wait["outputs"] = outputs
    return {
        "entrypoint": "main",
        "templates": [
            {
                "name": "main",
                "steps": [
                    [{"name": "wait", "template": "wait"}],
                    [
                        {
                            "name": "after",
                            "template": "echo",
                            "arguments": {
                                "parameters": [
                                    {
                                        "name": "m",
                                        "value": "{{steps.wait.outputs.parameters.answer}}",
                                    }
                                ]
                            },
                        }
                    ],
                ],
            },  # fmt: skip
            wait,
            {
                "name": "echo",
                "inputs": {"parameters": [{"name": "m"}]},
                "container": {"command": ["echo", "{{inputs.parameters.m}}"]},
            },
        ],
    }


def test_a_suspend_with_a_duration_waits_then_continues_with_its_defaults(tmp_path):
    outputs = {"parameters": [{"name": "answer", "valueFrom": {"default": "YES"}}]}
    t0 = time.monotonic()
    result = _run(_suspending({"duration": "1"}, outputs), tmp_path)
    assert result.phase == "Succeeded", result.message
    assert time.monotonic() - t0 >= 1.0
    wait = result.node("wait")
    assert wait["type"] == "Suspend" and wait["phase"] == "Succeeded"
    assert result.node("after")["outputs"]["result"] == "YES"


def test_a_suspend_ends_with_the_workflow_deadline(tmp_path):
    spec = _suspending({"duration": "1m"})
    spec["activeDeadlineSeconds"] = 1
    result = _run(spec, tmp_path)
    assert result.phase == "Failed"
    assert result.node("wait")["phase"] == "Failed"


@pytest.mark.parametrize(
    ("suspend", "text"),
    [({}, "waits for `argo resume`"), ({"duration": "soon"}, "invalid duration")],
)
def test_a_suspend_without_a_usable_duration_is_refused(suspend, text, tmp_path):
    with pytest.raises(SpecError, match=text):
        _run(_suspending(suspend), tmp_path)


def test_pod_resources_claims_and_stray_annotations_are_accepted(tmp_path):
    spec = {
        "entrypoint": "main",
        "podResources": {"limits": {"cpu": "1"}},
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}],
        "templates": [
            {
                "name": "main",
                "annotations": {"workflows.argoproj.io/display-name": "x"},
                "podResources": {"limits": {"cpu": "2"}},
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "u"}],
                "container": {"command": ["echo", "ok"]},
            }
        ],
    }
    assert _run(spec, tmp_path).phase == "Succeeded"

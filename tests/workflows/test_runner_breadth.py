"""Breadth features for Argo's own examples: `[sh, -c]` scripts, `{{workflow.scheduledTime}}`
and a `dag.target` given by a parameter (spec.py, dag_exec.py, leaf.py, context.py)."""

from __future__ import annotations

import io
import re
from datetime import datetime
from pathlib import Path

import pytest
from ckptflow.workflows.runner import SpecError, run_workflow


def workflow(entry: str, *templates: dict, kind: str = "Workflow", **spec) -> dict:
    body = {"entrypoint": entry, "templates": list(templates), **spec}
    if kind == "CronWorkflow":
        body = {"schedule": "* * * * *", "workflowSpec": body}
    return {"kind": kind, "metadata": {"name": "wf"}, "spec": body}


def sh(name: str, script: str, **extra) -> dict:
    return {"name": name, "container": {"command": ["sh", "-c"], "args": [script]}, **extra}


def run(manifest: dict, tmp_path: Path, **kwargs):
    return run_workflow(
        manifest, workdir=str(tmp_path / "w"), name="wf", stream=io.StringIO(), **kwargs
    )


def test_a_script_run_by_sh_dash_c_is_executable(tmp_path):
    # Argo runs command + [script path]: `sh -c /path` executes the file, so it must be +x
    tmpl = {"name": "s", "script": {"command": ["sh", "-c"], "source": "echo $((1 + 2))"}}
    result = run(workflow("s", tmpl), tmp_path)
    assert result.phase == "Succeeded", result.node("wf")
    assert result.node("wf")["outputs"]["result"] == "3"


def test_scheduled_time_of_a_cron_workflow_run_by_hand(tmp_path):
    manifest = workflow("a", sh("a", "echo {{workflow.scheduledTime}}"), kind="CronWorkflow")
    result = run(manifest, tmp_path)
    assert result.phase == "Succeeded"
    stamp = result.node("wf")["outputs"]["result"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", stamp)
    started = datetime.fromisoformat(result.status["status"]["startedAt"])
    assert abs((datetime.fromisoformat(stamp) - started).total_seconds()) <= 1


def _dag(target: str) -> dict:
    return {
        "name": "d",
        "dag": {
            "target": target,
            "tasks": [
                {"name": "A", "template": "t"},
                {"name": "B", "template": "t", "depends": "A"},
                {"name": "C", "template": "t", "depends": "A"},
            ],
        },
    }


def test_dag_target_from_a_workflow_parameter(tmp_path):
    args = {"parameters": [{"name": "target", "value": "B"}]}
    manifest = workflow(
        "d", _dag("{{workflow.parameters.target}}"), sh("t", "true"), arguments=args
    )
    result = run(manifest, tmp_path)
    assert result.phase == "Succeeded"
    assert {"A", "B"} <= set(result.phases()) and "C" not in result.phases()
    result = run(manifest, tmp_path / "again", arguments={"target": "C"})
    assert "C" in result.phases() and "B" not in result.phases()


def test_dag_target_parameter_naming_an_unknown_task_is_refused(tmp_path):
    args = {"parameters": [{"name": "target", "value": "B"}]}
    manifest = workflow(
        "d", _dag("{{workflow.parameters.target}}"), sh("t", "true"), arguments=args
    )
    with pytest.raises(SpecError, match="dag.target: unknown task 'Z'"):
        run(manifest, tmp_path, arguments={"target": "Z"})


def test_dag_target_from_an_input_parameter_is_checked_when_the_dag_runs(tmp_path):
    dag = _dag("{{inputs.parameters.t}}") | {"inputs": {"parameters": [{"name": "t"}]}}
    outer = {
        "name": "main",
        "steps": [
            [{"name": "ok", "template": "d", "arguments": {"parameters": [{"name": "t", "value": "C"}]}}],
            [{"name": "bad", "template": "d", "arguments": {"parameters": [{"name": "t", "value": "Z"}]}}],
        ],
    }  # fmt: skip
    result = run(workflow("main", outer, dag, sh("t", "true")), tmp_path)
    assert result.node("ok")["phase"] == "Succeeded"
    assert result.node("bad")["phase"] == "Error"
    assert "unknown task 'Z'" in result.node("bad")["message"]


def test_a_windows_container_is_refused_naming_the_node_selector(tmp_path):
    tmpl = sh("w", "echo hi", nodeSelector={"kubernetes.io/os": "windows"})
    with pytest.raises(SpecError, match=r"template 'w': nodeSelector.kubernetes.io/os=windows"):
        run(workflow("w", tmpl), tmp_path)
    linux = sh("w", "echo hi", nodeSelector={"kubernetes.io/os": "linux"})
    assert run(workflow("w", linux), tmp_path).phase == "Succeeded"


def test_ignored_metrics_may_use_tags_known_only_to_the_controller(tmp_path):
    metrics = {"prometheus": [{"name": "result", "help": "x", "labels": [
        {"key": "status", "value": "{{status}}"}], "counter": {"value": "1"}}]}  # fmt: skip
    result = run(workflow("m", sh("m", "echo ok", metrics=metrics)), tmp_path)
    assert result.phase == "Succeeded", result.node("wf")["message"]


def test_a_command_that_is_not_installed_is_refused_before_anything_runs(tmp_path):
    tmpl = {"name": "w", "container": {"image": "docker/whalesay", "command": ["cowsay-ckptflow"]}}
    with pytest.raises(SpecError) as info:
        run(workflow("w", tmpl, sh("ok", "true")), tmp_path)
    assert "template 'w': command 'cowsay-ckptflow': not installed on this machine" in str(
        info.value
    )
    assert "docker/whalesay" in str(info.value)
    assert not (tmp_path / "w" / "pods").exists()
    # the template's own PATH is where it is looked for
    tool = tmp_path / "bin" / "cowsay-ckptflow"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\necho moo\n")
    tool.chmod(0o755)
    tmpl["container"]["env"] = [{"name": "PATH", "value": f"{tool.parent}:/usr/bin:/bin"}]
    assert run(workflow("w", tmpl), tmp_path).phase == "Succeeded"


def test_a_timeout_given_by_a_parameter_is_applied_when_the_template_runs(tmp_path):
    sleepy = sh("s", "sleep 5", timeout="{{inputs.parameters.t}}",
                inputs={"parameters": [{"name": "t"}]})  # fmt: skip
    steps = {"name": "main", "steps": [[
        {"name": "short", "template": "s", "arguments": {"parameters": [{"name": "t", "value": "1s"}]}},
        {"name": "bad", "template": "s", "arguments": {"parameters": [{"name": "t", "value": "soon"}]},
         "continueOn": {"error": True}},
    ]]}  # fmt: skip
    result = run(workflow("main", steps, sleepy), tmp_path)
    short = result.node("short")
    assert short["phase"] == "Failed" and "deadline" in short["message"]
    assert result.node("bad")["phase"] == "Error"
    assert "invalid duration 'soon'" in result.node("bad")["message"]


def test_steps_name_and_tasks_name_are_the_invoking_step_or_task(tmp_path):
    echo = sh("echo", "echo {{steps.name}}", retryStrategy={"limit": 1})
    echo_t = sh("echo-t", "echo {{tasks.name}}")
    steps = {"name": "main", "steps": [
        [{"name": "first", "template": "echo"}],
        [{"name": "second", "template": "dag", "arguments": {"parameters": [{"name": "s", "value": "{{steps.name}}"}]}}],
    ]}  # fmt: skip
    dag = {"name": "dag", "inputs": {"parameters": [{"name": "s"}]},
           "dag": {"tasks": [{"name": "T", "template": "echo-t"}]}}  # fmt: skip
    result = run(workflow("main", steps, dag, echo, echo_t), tmp_path)
    assert result.phase == "Succeeded", result.status["status"]["nodes"]
    assert result.node("first")["outputs"]["result"] == "first"
    assert result.node("T")["outputs"]["result"] == "T"
    assert result.node("second")["inputs"]["parameters"][0]["value"] == "second"

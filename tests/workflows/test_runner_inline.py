"""Inline templates of steps/DAG tasks and `templateDefaults` (workflows/runner/template_forms.py),
as Argo resolves them (workflow/controller/steps.go, dag.go, operator.go
mergedTemplateDefaultsInto), on small manifests."""

from __future__ import annotations

import io

import pytest
from ckptflow.workflows.runner import SpecError, run_workflow
from ckptflow.workflows.runner.template_forms import expand, merge_defaults


def _run(spec: dict, tmp_path, **kw):
    return run_workflow(
        {"metadata": {"name": "wf"}, "spec": spec}, workdir=str(tmp_path / "w"),
        stream=io.StringIO(), **kw,
    )  # fmt: skip


def _echo(text: str) -> dict:
    return {"container": {"image": "busybox", "command": ["echo", text]}}


def test_inline_steps_and_dag_tasks_run_with_their_inputs(tmp_path):
    spec = {
        "entrypoint": "main",
        "templates": [
            {
                "name": "main",
                "steps": [
                    [{"name": "a", "inline": _echo("from-a")}],
                    [{"name": "d", "template": "dag"}],
                ],
            },
            {
                "name": "dag",
                "dag": {
                    "tasks": [
                        {
                            "name": "b",
                            "arguments": {"parameters": [{"name": "m", "value": "hi"}]},
                            "inline": {
                                "inputs": {"parameters": [{"name": "m"}]},
                                "container": {"command": ["echo", "{{inputs.parameters.m}}"]},
                            },
                        },
                        {
                            "name": "c",
                            "depends": "b",
                            "inline": {  # an inline steps template with an inline step
                                "steps": [[{"name": "deep", "inline": _echo("deep")}]]
                            },
                        },
                    ]
                },
            },
        ],
    }
    result = _run(spec, tmp_path)
    assert result.phase == "Succeeded", result.message
    assert result.node("a")["outputs"]["result"] == "from-a"
    assert result.node("b")["outputs"]["result"] == "hi"
    assert result.node("deep")["outputs"]["result"] == "deep"
    assert result.node("c")["type"] == "Steps"


def test_an_inline_template_is_validated_like_any_other(tmp_path):
    spec = {
        "entrypoint": "main",
        "templates": [
            {"name": "main", "steps": [[{"name": "a", "inline": {"container": {"image": "x"}}}]]}
        ],
    }
    with pytest.raises(SpecError, match=r"template 'main/a': command: missing"):
        _run(spec, tmp_path)


def test_inline_with_template_too_is_refused(tmp_path):
    spec = {
        "entrypoint": "main",
        "templates": [
            {"name": "main", "steps": [[{"name": "a", "template": "e", "inline": _echo("x")}]]},
            {"name": "e", **_echo("e")},
        ],
    }
    with pytest.raises(SpecError, match="give template, templateRef or inline, only one"):
        _run(spec, tmp_path)


def test_expand_leaves_the_spec_unchanged():
    spec = {"templates": [{"name": "m", "dag": {"tasks": [{"name": "t", "inline": _echo("x")}]}}]}
    out = expand(spec)
    assert "inline" in spec["templates"][0]["dag"]["tasks"][0]
    assert out["templates"][0]["dag"]["tasks"][0] == {"name": "t", "template": "m/t"}
    assert out["templates"][1]["name"] == "m/t"


def test_template_defaults_apply_and_the_templates_own_values_win(tmp_path):
    spec = {
        "entrypoint": "main",
        "templateDefaults": {
            "activeDeadlineSeconds": 1,
            "container": {"env": [{"name": "GREETING", "value": "default"}]},
        },
        "templates": [
            {
                "name": "main",
                "activeDeadlineSeconds": 60,
                "steps": [
                    [{"name": "slow", "template": "slow"}, {"name": "own", "template": "own"}]
                ],
            },
            {"name": "slow", "container": {"command": ["sh", "-c", "sleep 5"]}},
            {
                "name": "own",
                "activeDeadlineSeconds": 30,
                "container": {
                    "command": ["sh", "-c", 'echo "$GREETING $OTHER"'],
                    "env": [{"name": "OTHER", "value": "mine"}],
                },
            },
        ],
    }
    result = _run(spec, tmp_path)
    assert result.node("slow")["phase"] == "Failed"  # the default deadline, 1s
    assert result.node("own")["phase"] == "Succeeded"
    assert result.node("own")["outputs"]["result"] == "default mine"  # env merged by name


def test_kind_defaults_apply_only_to_that_kind():
    defaults = {"timeout": "30s", "container": {"workingDir": "/w"}, "retryStrategy": {"limit": 2}}
    steps = merge_defaults(defaults, {"name": "s", "steps": []})
    assert "container" not in steps and steps["timeout"] == "30s"
    c = merge_defaults(defaults, {"name": "c", "retryStrategy": {"limit": 5}, "container": {}})
    assert c["container"] == {"workingDir": "/w"} and c["retryStrategy"] == {"limit": 5}


def test_template_defaults_that_are_not_a_mapping_are_refused(tmp_path):
    spec = {
        "entrypoint": "m",
        "templateDefaults": ["x"],
        "templates": [{"name": "m", **_echo("x")}],
    }
    with pytest.raises(SpecError, match="templateDefaults: expected a template"):
        _run(spec, tmp_path)

"""Argo's examples that use expressions (`{{=...}}`, `valueFrom.expression`, retryStrategy
`expression`), vendored unchanged in tests/workflows/fixtures/argo-examples/, run with the local
runner to Argo's outcome and outputs; and `fromExpression` on a small manifest (Argo's own
conditional-artifacts examples write a relative path in the image's WORKDIR `/`)."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from ckptflow.workflows.runner import SpecError, load_manifest, run_workflow

VENDORED = Path(__file__).parent / "fixtures" / "argo-examples"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "argo" / "examples"

# name -> what the entrypoint's script prints (its outputs.result)
PRINTS = {
    "expression-destructure-json": "123",
    "expression-destructure-json-complex": (
        '[43][43][{"age":43,"name":"Baris"}]["Baris","Mo","Jai"]'
    ),
    "expression-reusing-verbose-snippets": (
        "The week's average temperature was 35.8 with a minimum of 15 and a maximum of 57."
    ),
}
CONDITIONAL = {"conditional-parameters": "steps", "dag-conditional-parameters": "tasks"}


def _run(name: str, tmp_path: Path, manifest: dict | None = None):
    manifest = manifest or load_manifest(str(VENDORED / f"{name}.yaml"))
    return run_workflow(
        manifest, workdir=str(tmp_path / "w"), name=name, stream=io.StringIO(),
        lock_dir=str(tmp_path / "locks"),
    )  # fmt: skip


@pytest.mark.skipif(not SHARED.is_dir(), reason="no Argo checkout at ../shared")
@pytest.mark.parametrize("name", [*PRINTS, *CONDITIONAL, "retry-conditional", "conditionals"])
def test_the_vendored_copy_is_unchanged(name):
    assert (VENDORED / f"{name}.yaml").read_bytes() == (SHARED / f"{name}.yaml").read_bytes()


@pytest.mark.parametrize("name", sorted(PRINTS))
def test_expression_tags_give_argos_values(name, tmp_path):
    """`{{=jsonpath(...)}}`, `map`/`#` aliases, sprig math and `toJson` in input parameters."""
    result = _run(name, tmp_path)
    assert result.phase == "Succeeded", result.status["status"].get("message")
    assert result.node(name)["outputs"]["result"] == PRINTS[name]


@pytest.mark.parametrize("name", sorted(CONDITIONAL))
def test_value_from_expression_picks_the_branch_that_ran(name, tmp_path):
    result = _run(name, tmp_path)
    assert result.phase == "Succeeded", result.status["status"].get("message")
    coin = result.node("flip-coin")["outputs"]["result"]
    assert coin in ("heads", "tails")
    assert result.node(coin)["phase"] == "Succeeded"
    assert result.node("tails" if coin == "heads" else "heads")["phase"] == "Skipped"
    params = result.node(name)["outputs"]["parameters"]
    assert params == [{"name": "stepresult", "value": coin}]


def test_retry_expression_stops_as_in_argo(tmp_path):
    """retry-conditional: each attempt exits 1 or 2 at random; the expression retries while the
    exit code is 2 (`asInt(lastRetry.duration)` reads whole seconds, as Argo's node times are)
    and stops at the first 1, so the retry node fails with Argo's message."""
    result = _run("retry-conditional", tmp_path)
    assert result.phase == "Failed", result.status["status"].get("message")
    retry = result.node("retry")
    assert retry["phase"] == "Failed"
    # all eleven attempts exiting 2 (1 in 2048) ends on the limit instead
    stopped = "retryStrategy.expression evaluated to false"
    assert retry["message"] in (stopped, "No more retries left")
    attempts = sorted(
        (
            n
            for n in result.status["status"]["nodes"].values()
            if n["displayName"].startswith("retry(")
        ),
        key=lambda n: int(n["displayName"][6:-1]),
    )
    assert [n["message"] for n in attempts[:-1]] == ["Error (exit code 2)"] * (len(attempts) - 1)
    if retry["message"] == stopped:
        assert attempts[-1]["message"] == "Error (exit code 1)"
    else:
        assert len(attempts) == 11 and attempts[-1]["message"] == "Error (exit code 2)"


def _sh(name: str, script: str, **extra) -> dict:
    return {
        "name": name,
        "container": {"image": "busybox", "command": ["sh", "-c", script]},
        **extra,
    }


def test_from_expression_passes_the_chosen_artifact_on(tmp_path):
    out = {"outputs": {"artifacts": [{"name": "r", "path": "/tmp/r.txt"}]}}
    manifest = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "fromexpr"},
        "spec": {
            "entrypoint": "main",
            "templates": [
                {
                    "name": "main",
                    "steps": [
                        [{"name": "pick", "template": "pick"}],
                        [
                            {
                                "name": "a",
                                "template": "a",
                                "when": "{{steps.pick.outputs.result}} == a",
                            },
                            {
                                "name": "b",
                                "template": "b",
                                "when": "{{steps.pick.outputs.result}} == b",
                            },
                        ],
                    ],
                    "outputs": {
                        "artifacts": [
                            {
                                "name": "r",
                                "fromExpression": "steps.pick.outputs.result == 'a' ? "
                                "steps.a.outputs.artifacts.r : steps.b.outputs.artifacts.r",
                            }
                        ],
                        "parameters": [
                            {"name": "n", "valueFrom": {"expression": "asInt('4') * 10 + 2"}},
                            {
                                "name": "d",
                                "valueFrom": {
                                    "expression": "steps.a.outputs.result",
                                    "default": "none",
                                },
                            },
                        ],
                    },
                },
                _sh("pick", "echo b"),
                _sh("a", "echo from-a > /tmp/r.txt", **out),
                _sh("b", "echo from-b > /tmp/r.txt", **out),
            ],
        },
    }
    result = _run("fromexpr", tmp_path, manifest)
    assert result.phase == "Succeeded", result.status["status"].get("message")
    root = result.node("fromexpr")
    assert root["outputs"]["parameters"] == [
        {"name": "n", "value": "42"},
        {"name": "d", "value": "none"},  # a was skipped: nil takes the default
    ]
    (art,) = root["outputs"]["artifacts"]
    b_art = result.node("b")["outputs"]["artifacts"][0]
    assert art["name"] == "r" and art["s3"]["key"] == b_art["s3"]["key"]


def test_an_unsupported_expression_refuses_the_manifest_before_it_runs(tmp_path):
    manifest = load_manifest(str(VENDORED / "expression-destructure-json.yaml"))
    inputs = manifest["spec"]["templates"][0]["inputs"]["parameters"]
    inputs[0]["value"] = "{{=sprig.env('HOME')}}"
    with pytest.raises(SpecError) as info:
        _run("expression-destructure-json", tmp_path, manifest)
    assert (
        "template 'main': inputs.parameters.a.value: {{=sprig.env('HOME')}}: "
        "function sprig.env() is not supported by the local runner"
    ) in str(info.value)
    assert not (tmp_path / "w" / "pods").exists()


def _workflow(name: str, *templates: dict) -> dict:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": name},
        "spec": {"entrypoint": templates[0]["name"], "templates": list(templates)},
    }


def test_expression_tags_over_loop_items(tmp_path):
    """expression-tag-template-workflow's DAG (its argosay image has no command here, so with
    `sh`): withParam from `toJson(filter(...))`, `{{=item}}` per item, asInt arithmetic and
    sprig.date on workflow.creationTimestamp."""
    main = {
        "name": "main",
        "dag": {
            "tasks": [
                {
                    "name": "task-0",
                    "template": "pod-0",
                    "arguments": {"parameters": [{"name": "foo", "value": "{{=item}}"}]},
                    "withParam": "{{=toJson(filter([1, 3], {# > 1}))}}",
                }
            ]
        },
    }
    pod = _sh(
        "pod-0",
        "echo 'hello {{=asInt(inputs.parameters.foo) * 10}} @ "
        "{{=sprig.date('2006', workflow.creationTimestamp)}}'",
        inputs={"parameters": [{"name": "foo"}]},
    )
    result = _run("tags", tmp_path, _workflow("tags", main, pod))
    assert result.phase == "Succeeded", result.status["status"].get("message")
    year = time.strftime("%Y")
    assert result.node("task-0(0:3)")["outputs"]["result"] == f"hello 30 @ {year}"


def test_an_expression_that_fails_at_run_time_says_why(tmp_path):
    pod = _sh("main", "echo {{=asInt(workflow.name)}}")
    result = _run("bad-int", tmp_path, _workflow("bad-int", pod))
    assert result.phase in ("Error", "Failed")
    assert result.node("bad-int")["message"] == (
        "failed to resolve {{=asInt(workflow.name)}}: invalid operation: int(bad-int)"
    )


def test_an_item_expression_sees_the_item_and_the_template_scope(tmp_path):
    main = {
        "name": "main",
        "inputs": {"parameters": [{"name": "n", "value": "5"}]},
        "steps": [
            [
                {
                    "name": "mul",
                    "template": "echo",
                    "arguments": {
                        "parameters": [
                            {"name": "v", "value": "{{=asInt(item) * asInt(inputs.parameters.n)}}"}
                        ]
                    },
                    "withItems": [1, 2],
                }
            ]
        ],
    }
    echo = _sh("echo", "echo {{inputs.parameters.v}}", inputs={"parameters": [{"name": "v"}]})
    result = _run("items", tmp_path, _workflow("items", main, echo))
    assert result.phase == "Succeeded", result.status["status"].get("message")
    assert result.node("mul(0:1)")["outputs"]["result"] == "5"
    assert result.node("mul(1:2)")["outputs"]["result"] == "10"


def test_conditionals_expr_form_of_when(tmp_path):
    """conditionals: `when` with `{{= inputs.parameters["should-print"] == 'true'}}` and
    `{{=jsonpath(workflow.parameters.json, '$[0].value') == 'true'}}` (Argo's JSON list of the
    workflow's parameters). Its argosay image's `cowsay` is not on this machine, so the pods
    echo instead (in memory; the vendored copy is unchanged)."""
    manifest = load_manifest(str(VENDORED / "conditionals.yaml"))
    argosay = manifest["spec"]["templates"][1]
    argosay["container"]["args"] = ["echo hello"]
    result = _run("conditionals", tmp_path, manifest)
    assert result.phase == "Succeeded", result.status["status"].get("message")
    for step in ("print-hello-govaluate", "print-hello-expr", "print-hello-expr-json"):
        assert result.node(step)["phase"] == "Succeeded", step
    manifest["spec"]["arguments"]["parameters"][0]["value"] = "false"
    result = _run("conditionals", tmp_path / "false", manifest)
    for step in ("print-hello-govaluate", "print-hello-expr", "print-hello-expr-json"):
        assert result.node(step)["phase"] == "Skipped", step

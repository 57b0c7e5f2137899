"""Control flow in the local runner: when, enhanced depends, failFast, targets, nested DAGs,
continueOn, retries and the exit handler, each checked against the phases Argo documents."""

from __future__ import annotations

import copy
import io
from pathlib import Path

import pytest
from ckptflow.workflows.runner import load_manifest, run_workflow

FIXTURES = Path(__file__).parent / "fixtures" / "runner"


def load(name: str) -> dict:
    return load_manifest(str(FIXTURES / f"{name}.yaml"))


def run(manifest: dict, tmp_path: Path, name: str, **kwargs):
    return run_workflow(
        manifest, workdir=str(tmp_path / name), name=name, stream=io.StringIO(), **kwargs
    )


def phases(result) -> dict[str, str]:
    return {n["displayName"]: n["phase"] for n in result.nodes.values()}


@pytest.mark.parametrize("coin", ["heads", "tails"])
def test_conditionals_follow_argo_when_syntax(tmp_path, coin):
    result = run(load("conditionals"), tmp_path, "cond", arguments={"coin": coin})
    assert result.phase == "Succeeded"
    got = phases(result)
    assert got["heads"] == ("Succeeded" if coin == "heads" else "Skipped")
    assert got["tails"] == ("Succeeded" if coin == "tails" else "Skipped")
    assert got["regex"] == ("Succeeded" if coin == "heads" else "Skipped")
    assert got["negated"] == ("Skipped" if coin == "heads" else "Succeeded")
    assert got["big"] == "Succeeded" and got["small"] == "Skipped"
    skipped = result.node("cond[1].small")
    assert skipped["type"] == "Skipped" and skipped["message"] == "when '7 < 5' evaluated false"


def test_enhanced_depends_with_a_failing_branch(tmp_path):
    result = run(load("depends"), tmp_path, "dep")
    got = phases(result)
    assert got["B"] == "Failed" and got["tolerant"] == "Failed"
    assert got["on-failure"] == "Succeeded"  # B.Failed
    assert got["on-success"] == "Omitted"  # B.Succeeded is false
    assert result.node("dep.on-success")["type"] == "Skipped"
    assert got["after-omitted"] == "Succeeded"  # on-success.Omitted
    assert got["either"] == "Succeeded"
    assert got["after-tolerant"] == "Succeeded"  # continueOn.failed widens the bare name
    # every target branch ends in a success: the DAG (and workflow) succeeds, as in Argo
    assert result.phase == "Succeeded"


def test_unhandled_failure_fails_the_dag_and_omits_dependents(tmp_path):
    manifest = load("depends")
    tasks = manifest["spec"]["templates"][0]["dag"]["tasks"]
    manifest["spec"]["templates"][0]["dag"]["tasks"] = [
        t for t in tasks if t["name"] in ("A", "B", "C")
    ] + [{"name": "D", "depends": "B && C", "template": "pass"}]
    result = run(manifest, tmp_path, "dep2")
    got = phases(result)
    assert got["D"] == "Omitted"
    assert result.phase == "Failed"  # D's branch inherits B's failure
    assert result.exit_code == 1


@pytest.mark.parametrize("fail_fast", [True, False])
def test_fail_fast_stops_new_tasks(tmp_path, fail_fast):
    manifest = load("fail-fast")
    manifest["spec"]["templates"][0]["dag"]["failFast"] = fail_fast
    result = run(manifest, tmp_path, "ff")
    got = phases(result)
    assert result.phase == "Failed"
    assert got["slow"] == "Succeeded"  # running tasks finish
    if fail_fast:
        assert "next" not in got
    else:
        assert got["next"] == "Succeeded"


def test_nested_dags_and_targets(tmp_path):
    result = run(load("nested-targets"), tmp_path, "nest")
    assert result.phase == "Succeeded"
    assert result.node("nest.first")["type"] == "DAG"
    assert result.node("nest.first")["outputs"]["parameters"] == [{"name": "out", "value": "one"}]
    assert result.node("nest.second.echo")["outputs"]["result"] == "one-two"
    assert result.node("nest.second.echo")["boundaryID"] == result.node("nest.second")["id"]
    names = {n["name"] for n in result.nodes.values()}
    assert {"nest.partial.A", "nest.partial.B"} <= names
    assert not {"nest.partial.C", "nest.partial.unrelated"} & names  # target: B


def test_retries_until_success_and_give_up(tmp_path):
    counter = tmp_path / "counter"
    result = run(load("retry"), tmp_path, "retry", arguments={"counter": str(counter)})
    flaky = result.node("retry[0].flaky")
    assert flaky["type"] == "Retry" and flaky["phase"] == "Succeeded"
    attempts = [result.node(f"retry[0].flaky({i})") for i in range(3)]
    assert [a["phase"] for a in attempts] == ["Failed", "Failed", "Succeeded"]
    assert [c for c in flaky["children"]] == [a["id"] for a in attempts]
    assert attempts[2]["outputs"]["result"] == "attempt 3 (retries=2)"
    assert counter.read_text() == "3"
    hopeless = result.node("retry[0].hopeless")
    assert hopeless["phase"] == "Failed" and hopeless["message"] == "No more retries left"
    assert len(hopeless["children"]) == 3  # limit 2 = three attempts
    assert result.phase == "Failed"


def test_retry_policy_on_error_does_not_retry_failures(tmp_path):
    manifest = load("retry")
    flaky = next(t for t in manifest["spec"]["templates"] if t["name"] == "flaky")
    flaky["retryStrategy"]["retryPolicy"] = "OnError"
    result = run(manifest, tmp_path, "onerr", arguments={"counter": str(tmp_path / "c")})
    assert result.node("onerr[0].flaky")["phase"] == "Failed"
    assert len(result.node("onerr[0].flaky")["children"]) == 1


def test_exit_handler_runs_after_failure_with_status(tmp_path):
    report = tmp_path / "report.txt"
    result = run(load("exit-handler"), tmp_path, "exit", arguments={"report": str(report)})
    assert result.phase == "Failed"
    handler = result.node("exit.onExit")
    assert handler["phase"] == "Succeeded"
    assert report.read_text() == "Failed exit"
    got = phases(result)
    assert got["celebrate"] == "Skipped" and got["cry"] == "Succeeded"
    assert result.node("exit.onExit[0].cry")["outputs"]["result"] == "Failed"


def test_exit_handler_failure_fails_a_successful_workflow(tmp_path):
    manifest = load("exit-handler")
    main = manifest["spec"]["templates"][0]
    main["container"]["args"] = ["echo fine"]
    result = run(manifest, tmp_path, "exit2", arguments={"report": str(tmp_path / "no" / "dir")})
    assert result.node("exit2.onExit")["phase"] == "Failed"  # cannot write into a missing dir
    assert result.phase == "Failed"


def test_continue_on_in_steps(tmp_path):
    manifest = copy.deepcopy(load("retry"))
    main = manifest["spec"]["templates"][0]
    main["steps"] = [
        [{"name": "bad", "template": "always-fails", "continueOn": {"failed": True}}],
        [{"name": "after", "template": "always-fails"}],
    ]
    for t in manifest["spec"]["templates"]:
        t.pop("retryStrategy", None)
    result = run(manifest, tmp_path, "cont", arguments={"counter": str(tmp_path / "c")})
    got = phases(result)
    assert got["bad"] == "Failed" and got["[0]"] == "Succeeded"
    assert got["after"] == "Failed" and got["[1]"] == "Failed"
    assert result.phase == "Failed"

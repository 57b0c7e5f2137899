"""Argo's examples with lifecycle hooks and step/task exit handlers, vendored unchanged in
tests/workflows/fixtures/argo-examples/, run with the local runner to Argo's outcome, node names
and phases, and the order Argo's controller keeps (a step group, or a task's dependents, wait for
its exit handlers: workflow/controller/steps.go, dag.go)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from ckptflow.workflows.runner import SpecError, load_manifest, run_workflow

VENDORED = Path(__file__).parent / "fixtures" / "argo-examples"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "argo" / "examples"

# name -> display names of nodes that end Succeeded (the workflow Succeeds too)
RUNS = {
    "exit-handler-step-level": [
        "hello1", "hello1.onExit", "hello2a", "hello2a.onExit", "hello2b", "hello2b.onExit",
    ],
    "exit-handler-with-param": ["step-1", "step-1.onExit"],
    "exit-handler-dag-level": ["A", "A.onExit", "B", "B.onExit", "C", "C.onExit", "D", "D.onExit"],
    "template-on-exit": ["stepA", "stepA.onExit", "stepB", "stepB.onExit"],
}  # fmt: skip
# name -> (node, the exit handler it must end before it starts)
AFTER = {
    "exit-handler-step-level": [("hello2a", "hello1.onExit"), ("hello2b", "hello1.onExit")],
    "exit-handler-dag-level": [
        ("B", "A.onExit"), ("C", "A.onExit"), ("D", "B.onExit"), ("D", "C.onExit"),
    ],
    "template-on-exit": [("stepB", "stepA.onExit")],
}  # fmt: skip
# refused for their hook template's `http:` (the Argo agent's), no longer for the hooks
REFUSED = {
    "life-cycle-hooks-tmpl-level": "template 'http': http: http templates run in the Argo agent",
    "life-cycle-hooks-wf-level": "template 'http': http: http templates run in the Argo agent",
}


def _run(name: str, tmp_path: Path):
    return run_workflow(
        load_manifest(str(VENDORED / f"{name}.yaml")), workdir=str(tmp_path / "w"), name=name,
        stream=io.StringIO(), lock_dir=str(tmp_path / "locks"),
    )  # fmt: skip


@pytest.mark.skipif(not SHARED.is_dir(), reason="no Argo checkout at ../shared")
@pytest.mark.parametrize("name", [*RUNS, *REFUSED])
def test_the_vendored_copy_is_unchanged(name):
    assert (VENDORED / f"{name}.yaml").read_bytes() == (SHARED / f"{name}.yaml").read_bytes()


@pytest.mark.parametrize("name", sorted(RUNS))
def test_exit_handler_examples_run_with_argos_outcome(name, tmp_path):
    result = _run(name, tmp_path)
    assert result.phase == "Succeeded", result.message
    for display in RUNS[name]:
        assert result.node(display)["phase"] == "Succeeded", display
        if display.endswith(".onExit"):
            handler, step = result.node(display), result.node(display[: -len(".onExit")])
            assert handler["name"] == step["name"] + ".onExit"  # common.GenerateOnExitNodeName
            assert handler["id"] in step["children"]  # exit_handler.go addChildNode
            assert handler["boundaryID"] == result.node(name)["id"]
    for later, handler in AFTER.get(name, []):
        ended = result.node(handler)["local"]["finishedAtUnix"]
        assert result.node(later)["local"]["startedAtUnix"] >= ended, (later, handler)


def test_the_exit_handler_gets_the_steps_output_parameter(tmp_path):
    result = _run("exit-handler-with-param", tmp_path)
    handler = result.node("step-1.onExit")
    assert handler["inputs"]["parameters"] == [{"name": "message", "value": "hello world"}]
    assert handler["outputs"]["result"] == "hello world"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_lifecycle_hook_examples_are_refused_only_for_their_http_template(name, tmp_path):
    with pytest.raises(SpecError) as err:
        _run(name, tmp_path)
    lines = str(err.value).splitlines()[1:]
    assert [line.strip() for line in lines] == [REFUSED[name]]

"""Lifecycle hooks and exit handlers in the local runner (workflows/runner/hooks.py), each rule on
a small manifest, checked against what Argo's controller does (workflow/controller/hooks.go,
exit_handler.go, operator.go, steps.go, dag.go)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from ckptflow.workflows.runner import SpecError, run_workflow


def manifest(text: str) -> dict:
    return yaml.safe_load(text)


def run(doc: dict, tmp_path: Path, name: str, **kwargs):
    return run_workflow(
        doc, workdir=str(tmp_path / name), name=name, stream=io.StringIO(), **kwargs
    )


def run_logged(doc: dict, tmp_path: Path, name: str):
    """Run `doc` with its `log` parameter naming a file the hooks append to: (result, file)."""
    log = tmp_path / "log.txt"
    return run(doc, tmp_path, name, arguments={"log": str(log)}), log


def by_name(result) -> dict[str, dict]:
    return {n["name"]: n for n in result.nodes.values()}


ECHO = """
    - name: echo
      inputs: {parameters: [{name: msg, default: hi}]}
      script:
        image: alpine
        command: [sh]
        source: 'echo "{{inputs.parameters.msg}}"'
    - name: fail
      script: {image: alpine, command: [sh], source: 'echo bad; exit 1'}
    - name: log
      inputs: {parameters: [{name: msg, default: hook}]}
      script:
        image: alpine
        command: [sh]
        source: 'echo "{{inputs.parameters.msg}}" >> "{{workflow.parameters.log}}"; echo logged'
"""


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# --- the workflow's hooks (operator.go, hooks.go executeWfLifeCycleHook) ---------------------


@pytest.mark.parametrize("main", ["echo", "fail"])
def test_the_workflow_exit_hook_runs_after_success_and_after_failure(tmp_path, main):
    doc = manifest(
        f"""
spec:
  entrypoint: {main}
  arguments: {{parameters: [{{name: log}}]}}
  hooks:
    exit:
      template: log
      arguments: {{parameters: [{{name: msg, value: "exit {{{{workflow.status}}}}"}}]}}
  templates:
{ECHO}"""
    )
    result, log = run_logged(doc, tmp_path, "wfexit")
    handler = result.node("wfexit.onExit")
    assert handler["phase"] == "Succeeded" and handler["templateName"] == "log"
    assert result.phase == ("Succeeded" if main == "echo" else "Failed")
    assert lines(log) == [f"exit {result.phase}"]


def test_the_workflow_exit_hook_without_arguments_gets_the_workflows(tmp_path):
    """workflow_types.go GetExitHook: WithArgs(spec.arguments) when the hook has none."""
    doc = manifest(
        f"""
spec:
  entrypoint: echo
  arguments: {{parameters: [{{name: log}}, {{name: msg, value: from-workflow}}]}}
  hooks: {{exit: {{template: log}}}}
  templates:
{ECHO}"""
    )
    result, log = run_logged(doc, tmp_path, "wfargs")
    assert result.phase == "Succeeded" and lines(log) == ["from-workflow"]


@pytest.mark.parametrize("outcome", ["Failed", "Error"])
def test_a_failing_exit_hook_turns_a_succeeded_workflow_with_its_message(tmp_path, outcome):
    """operator.go: Failed handler -> markWorkflowFailed(handler.Message); Error -> Error."""
    exit_tmpl = "fail" if outcome == "Failed" else "needs-input"
    doc = manifest(
        f"""
spec:
  entrypoint: echo
  arguments: {{parameters: [{{name: log}}]}}
  hooks: {{exit: {{template: {exit_tmpl}}}}}
  templates:
{ECHO}
    - name: needs-input
      inputs: {{parameters: [{{name: nowhere}}]}}
      script: {{image: alpine, command: [sh], source: 'true'}}
"""
    )
    result = run(doc, tmp_path, "wfbad", arguments={"log": str(tmp_path / "l")})
    handler = result.node("wfbad.onExit")
    assert handler["phase"] == outcome
    assert result.phase == outcome and result.message == handler["message"]


def test_a_workflow_expression_hook_fires_once_and_the_workflow_waits_for_it(tmp_path):
    doc = manifest(
        f"""
spec:
  entrypoint: main
  arguments: {{parameters: [{{name: log}}]}}
  hooks:
    running:
      expression: workflow.status == "Running"
      template: log
      arguments: {{parameters: [{{name: msg, value: running}}]}}
    succeeded:
      expression: workflow.status == "Succeeded"
      template: slow-log
    failed:
      expression: workflow.status == "Failed"
      template: log
    exit: {{template: log, arguments: {{parameters: [{{name: msg, value: exit}}]}}}}
  templates:
    - name: main
      steps:
      - - {{name: one, template: sleep}}
      - - {{name: two, template: sleep}}
    - name: sleep
      script: {{image: alpine, command: [sh], source: 'sleep 0.5'}}
    - name: slow-log
      script:
        image: alpine
        command: [sh]
        source: 'sleep 1; echo succeeded >> "{{{{workflow.parameters.log}}}}"'
{ECHO}"""
    )
    result, log = run_logged(doc, tmp_path, "wfhooks")
    assert result.phase == "Succeeded"
    # the running hook once, though the workflow stayed Running through two steps; the
    # succeeded hook finished before the exit handler started; the failed one never ran
    assert lines(log) == ["running", "succeeded", "exit"]
    nodes = by_name(result)
    assert "wfhooks.hooks.failed" not in nodes
    running = nodes["wfhooks.hooks.running"]
    assert running["displayName"] == "wfhooks.hooks.running" and "boundaryID" not in running
    assert running["id"] in nodes["wfhooks"]["children"]  # hooks.go addChildNode(wf.Name, ...)


def test_a_workflow_hook_expression_that_cannot_be_evaluated_makes_the_workflow_error(tmp_path):
    doc = manifest(
        f"""
spec:
  entrypoint: echo
  arguments: {{parameters: [{{name: log}}]}}
  hooks:
    typo: {{expression: workflow.stauts.phase == "Running", template: log}}
  templates:
{ECHO}"""
    )
    result = run(doc, tmp_path, "wftypo", arguments={"log": str(tmp_path / "l")})
    assert result.phase == "Error" and result.message.startswith("hooks.typo:")


# --- step and task hooks (steps.go, dag.go, exit_handler.go) ---------------------------------

STEPS = f"""
spec:
  entrypoint: main
  arguments: {{parameters: [{{name: log}}]}}
  templates:
    - name: main
      steps:
      - - name: step-1
          template: produce
          hooks:
            running:
              expression: steps["step-1"].status == "Running"
              template: log
              arguments: {{parameters: [{{name: msg, value: "running"}}]}}
            done:
              expression: steps["step-1"].status == "Succeeded"
              template: log
              arguments:
                parameters: [{{name: msg, value: "done {{{{steps.step-1.outputs.parameters.out}}}}"}}]
            failed:
              expression: steps["step-1"].status == "Failed"
              template: log
            exit:
              template: log
              arguments:
                parameters: [{{name: msg, value: "exit {{{{steps.step-1.outputs.parameters.out}}}}"}}]
      - - name: step-2
          template: echo
          onExit: log
    - name: produce
      script:
        image: alpine
        command: [sh]
        source: 'sleep 0.3; echo -n forty-two > /tmp/out'
      outputs:
        parameters: [{{name: out, valueFrom: {{path: /tmp/out}}}}]
{ECHO}"""


def test_step_hooks_fire_once_each_then_the_exit_handler_then_the_next_group(tmp_path):
    result, log = run_logged(manifest(STEPS), tmp_path, "sh")
    assert result.phase == "Succeeded"
    # step-2's onExit (no arguments) gets the workflow's: its `msg` input falls to the default
    assert lines(log) == ["running", "done forty-two", "exit forty-two", "hook"]
    nodes = by_name(result)
    step = nodes["sh[0].step-1"]
    hooked = {
        "sh[0].step-1.hooks.running": "step-1.hooks.running",
        "sh[0].step-1.hooks.done": "step-1.hooks.done",
        "sh[0].step-1.onExit": "step-1.onExit",
        "sh[1].step-2.onExit": "step-2.onExit",
    }
    for name, display in hooked.items():
        assert nodes[name]["displayName"] == display and nodes[name]["phase"] == "Succeeded"
        assert nodes[name]["boundaryID"] == nodes["sh"]["id"]
    assert "sh[0].step-1.hooks.failed" not in nodes
    assert {nodes[n]["id"] for n in list(hooked)[:3]} <= set(step["children"])
    exit_inputs = nodes["sh[0].step-1.onExit"]["inputs"]["parameters"]
    assert exit_inputs == [{"name": "msg", "value": "exit forty-two"}]


def test_a_step_exit_handler_runs_after_its_step_failed_and_the_group_waits(tmp_path):
    doc = manifest(STEPS)
    step = doc["spec"]["templates"][0]["steps"][0][0]
    step["template"] = "fail"
    exit_args = step["hooks"]["exit"]["arguments"]["parameters"]
    exit_args[0]["value"] = "exit {{steps.step-1.status}}"
    result, log = run_logged(doc, tmp_path, "sf")
    assert result.phase == "Failed"
    nodes = by_name(result)
    assert nodes["sf[0].step-1"]["phase"] == "Failed"
    assert nodes["sf[0].step-1.hooks.failed"]["phase"] == "Succeeded"
    assert lines(log)[-1] == "exit Failed"  # after the hooks it fired had finished
    assert nodes["sf[0].step-1.onExit"]["phase"] == "Succeeded"
    assert "sf[1]" not in nodes and "sf[0].step-1.hooks.done" not in nodes


def test_a_failing_step_exit_handler_leaves_the_step_and_workflow_alone(tmp_path):
    """steps.go: the group's phase comes from its steps only; the onExit is the step's child."""
    doc = manifest(STEPS)
    doc["spec"]["templates"][0]["steps"][1][0]["onExit"] = "fail"
    result = run(doc, tmp_path, "sx", arguments={"log": str(tmp_path / "l")})
    nodes = by_name(result)
    assert nodes["sx[1].step-2.onExit"]["phase"] == "Failed"
    assert nodes["sx[1].step-2"]["phase"] == "Succeeded" and nodes["sx[1]"]["phase"] == "Succeeded"
    assert result.phase == "Succeeded"


def test_a_step_exit_handler_still_runs_past_the_workflow_deadline(tmp_path):
    """operator.go executeTemplate: an onExit template is let through after the deadline."""
    doc = manifest(
        f"""
spec:
  entrypoint: main
  activeDeadlineSeconds: 1
  arguments: {{parameters: [{{name: log}}]}}
  templates:
    - name: main
      steps:
      - - {{name: slow, template: sleep, onExit: log}}
    - name: sleep
      script: {{image: alpine, command: [sh], source: 'sleep 30'}}
{ECHO}"""
    )
    result, log = run_logged(doc, tmp_path, "dl")
    assert result.phase == "Failed"
    assert result.node("dl[0].slow")["phase"] == "Failed"
    assert result.node("dl[0].slow.onExit")["phase"] == "Succeeded" and lines(log) == ["hook"]


def test_a_dag_task_exit_handler_and_hooks_end_before_its_dependents_start(tmp_path):
    """dag.go evaluateDependsLogic: common.CheckAllHooksFullfilled on each dependency."""
    doc = manifest(
        f"""
spec:
  entrypoint: main
  arguments: {{parameters: [{{name: log}}]}}
  templates:
    - name: main
      dag:
        tasks:
        - name: A
          template: echo
          hooks:
            exit:
              template: slow-log
              arguments: {{parameters: [{{name: msg, value: "A {{{{tasks.A.status}}}}"}}]}}
            ok: {{expression: tasks.A.status == "Succeeded", template: log}}
        - {{name: B, depends: A, template: log, arguments: {{parameters: [{{name: msg, value: B}}]}}}}
    - name: slow-log
      inputs: {{parameters: [{{name: msg}}]}}
      script:
        image: alpine
        command: [sh]
        source: 'sleep 0.5; echo "{{{{inputs.parameters.msg}}}}" >> "{{{{workflow.parameters.log}}}}"'
{ECHO}"""
    )
    result, log = run_logged(doc, tmp_path, "dg")
    assert result.phase == "Succeeded"
    assert lines(log) == ["hook", "A Succeeded", "B"]
    assert result.node("A.onExit")["name"] == "dg.A.onExit"
    assert result.node("A.hooks.ok")["boundaryID"] == result.node("dg")["id"]


def test_a_step_hook_expression_that_cannot_be_evaluated_makes_the_step_error(tmp_path):
    doc = manifest(STEPS)
    hooks = doc["spec"]["templates"][0]["steps"][0][0]["hooks"]
    hooks["running"]["expression"] = 'steps["no-such-step"].status == "Running"'
    result = run(doc, tmp_path, "se", arguments={"log": str(tmp_path / "l")})
    step = result.node("se[0].step-1")
    assert step["phase"] == "Error" and step["message"].startswith("hooks.running:")
    assert result.phase != "Succeeded"


def test_looped_steps_get_one_exit_handler_per_item(tmp_path):
    doc = manifest(
        f"""
spec:
  entrypoint: main
  arguments: {{parameters: [{{name: log}}]}}
  templates:
    - name: main
      steps:
      - - name: each
          template: echo
          withItems: [a, b]
          hooks:
            exit: {{template: log, arguments: {{parameters: [{{name: msg, value: "{{{{item}}}}"}}]}}}}
{ECHO}"""
    )
    result, log = run_logged(doc, tmp_path, "lp")
    assert result.phase == "Succeeded" and sorted(lines(log)) == ["a", "b"]
    assert result.node("lp[0].each(0:a).onExit")["displayName"] == "each(0:a).onExit"


# --- what the validator refuses (workflow/validate/validate.go validateHooks) -----------------


@pytest.mark.parametrize(
    ("hooks", "said"),
    [
        ({"running": {"template": "echo"}}, "hooks.running: Expression required"),
        ({"exit": {"template": "nope"}}, "hooks.exit.template: no template named 'nope'"),
        (
            {"exit": {"templateRef": {"name": "x", "template": "y"}}},
            "hooks.exit.templateRef: templates of other WorkflowTemplates",
        ),
        ({"x": {"template": "echo", "expression": "a ==="}}, "hooks.x.expression:"),
    ],
)
def test_bad_hooks_are_refused_before_anything_runs(tmp_path, hooks, said):
    for where in ("spec", "step"):
        doc = manifest(f"spec:\n  entrypoint: main\n  templates:\n{ECHO}")
        doc["spec"]["templates"].append(
            {"name": "main", "steps": [[{"name": "s", "template": "echo"}]]}
        )
        (doc["spec"] if where == "spec" else doc["spec"]["templates"][-1]["steps"][0][0])[
            "hooks"
        ] = hooks
        with pytest.raises(SpecError, match=said.replace("(", r"\(")):
            run(doc, tmp_path, f"bad-{where}")


def test_an_unknown_step_on_exit_template_is_refused(tmp_path):
    doc = manifest(f"spec:\n  entrypoint: main\n  templates:\n{ECHO}")
    doc["spec"]["templates"].append(
        {"name": "main", "steps": [[{"name": "s", "template": "echo", "onExit": "gone"}]]}
    )
    with pytest.raises(SpecError, match="step/task 's': onExit: no template named 'gone'"):
        run(doc, tmp_path, "bad")


def test_a_looped_dag_task_has_named_hooks_on_its_group_and_an_exit_handler_per_item(tmp_path):
    """dag.go executeDAGTask: named hooks on the task's node (the TaskGroup), runOnExitNode on
    each expanded task; the group ends once the items' exit handlers ended."""
    doc = manifest(
        f"""
spec:
  entrypoint: main
  arguments: {{parameters: [{{name: log}}]}}
  templates:
    - name: main
      dag:
        tasks:
        - name: each
          template: echo
          withItems: [a, b]
          hooks:
            done:
              expression: tasks.each.status == "Succeeded"
              template: log
              arguments: {{parameters: [{{name: msg, value: group}}]}}
            exit: {{template: log, arguments: {{parameters: [{{name: msg, value: "{{{{item}}}}"}}]}}}}
{ECHO}"""
    )
    result, log = run_logged(doc, tmp_path, "lg")
    assert result.phase == "Succeeded"
    got = lines(log)
    assert sorted(got[:2]) == ["a", "b"] and got[2:] == ["group"]
    nodes = by_name(result)
    assert nodes["lg.each.hooks.done"]["displayName"] == "each.hooks.done"
    assert nodes["lg.each.hooks.done"]["id"] in nodes["lg.each"]["children"]
    assert nodes["lg.each(0:a).onExit"]["phase"] == "Succeeded"
    assert not [n for n in nodes if n.startswith("lg.each(") and ".hooks." in n]


def test_workflow_status_is_the_workflows_phase_while_it_runs(tmp_path):
    """operator.go sets `workflow.status` in the global scope on every pass: Running here."""
    doc = manifest(
        f"""
spec:
  entrypoint: main
  arguments: {{parameters: [{{name: log}}]}}
  templates:
    - name: main
      steps:
      - - {{name: s, template: log, arguments: {{parameters: [{{name: msg, value: "{{{{workflow.status}}}}"}}]}}}}
{ECHO}"""
    )
    result, log = run_logged(doc, tmp_path, "st")
    assert result.phase == "Succeeded"
    assert lines(log) == ["Running"]


def test_omitted_and_skipped_dag_tasks_fire_their_named_hooks_and_no_exit_handler(tmp_path):
    """dag.go executeDAGTask evaluates a fulfilled task node's hooks (Omitted, Skipped too);
    runOnExitNode needs a completed one. steps.go gives a skipped step's none."""
    doc = manifest(
        f"""
spec:
  entrypoint: main
  arguments: {{parameters: [{{name: log}}]}}
  templates:
    - name: main
      dag:
        tasks:
        - {{name: A, template: echo}}
        - name: B
          depends: A.Failed
          template: echo
          onExit: log
          hooks:
            why: {{expression: tasks.B.status == "Omitted", template: log, arguments: {{parameters: [{{name: msg, value: B}}]}}}}
        - name: C
          when: "1 == 2"
          template: echo
          hooks:
            why: {{expression: tasks.C.status == "Skipped", template: log, arguments: {{parameters: [{{name: msg, value: C}}]}}}}
            exit: {{template: log}}
    - name: steps
      steps:
      - - name: S
          when: "1 == 2"
          template: echo
          hooks:
            why: {{expression: steps.S.status == "Skipped", template: log}}
{ECHO}"""
    )
    result, log = run_logged(doc, tmp_path, "om")
    assert result.phase == "Succeeded"
    assert sorted(lines(log)) == ["B", "C"]
    assert result.node("B")["phase"] == "Omitted" and result.node("C")["phase"] == "Skipped"
    assert result.node("B.hooks.why")["phase"] == "Succeeded"
    assert result.node("C.hooks.why")["phase"] == "Succeeded"
    doc["spec"]["entrypoint"] = "steps"
    result = run(doc, tmp_path, "sk", arguments={"log": str(tmp_path / "s.txt")})
    assert result.phase == "Succeeded" and lines(tmp_path / "s.txt") == []

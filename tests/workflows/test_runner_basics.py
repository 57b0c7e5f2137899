"""The local runner on plain manifests: containers, scripts, DAGs, steps, parameters, loops."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from ckptflow.workflows.runner import load_manifest, run_workflow

FIXTURES = Path(__file__).parent / "fixtures" / "runner"


def run_fixture(name: str, tmp_path: Path, **kwargs):
    manifest = load_manifest(str(FIXTURES / f"{name}.yaml"))
    return run_workflow(
        manifest, workdir=str(tmp_path / "run"), name=name, stream=io.StringIO(), **kwargs
    )


def by_name(result, name: str) -> dict:
    return result.node(name)


def test_hello_world_succeeds_and_logs(tmp_path):
    result = run_fixture("hello-world", tmp_path)
    assert result.phase == "Succeeded" and result.exit_code == 0
    root = by_name(result, "hello-world")
    assert root["type"] == "Pod" and root["outputs"]["result"] == "hello world"
    assert Path(root["local"]["logFile"]).read_text() == "hello world\n"
    assert root["local"]["exitCode"] == 0 and root["podIP"] == "127.0.0.1"
    assert root["outputs"]["exitCode"] == "0"


def test_status_file_mirrors_argo_nodes(tmp_path):
    result = run_fixture("dag-diamond", tmp_path)
    status = json.loads(Path(result.status_file).read_text())
    assert status["status"]["phase"] == "Succeeded"
    assert status["status"]["progress"] == "4/4"
    nodes = status["status"]["nodes"]
    root = nodes["dag-diamond"]
    assert root["type"] == "DAG" and root["displayName"] == "dag-diamond"
    by_display = {n["displayName"]: n for n in nodes.values()}
    for key in ("id", "name", "displayName", "type", "phase", "startedAt", "finishedAt"):
        assert key in by_display["A"]
    assert by_display["A"]["boundaryID"] == "dag-diamond"
    assert by_display["A"]["id"].startswith("dag-diamond-")
    # children follow the dependency edges, as in Argo: A -> B, C -> D
    assert root["children"] == [by_display["A"]["id"]]
    assert set(by_display["A"]["children"]) == {by_display["B"]["id"], by_display["C"]["id"]}
    assert by_display["B"]["children"] == [by_display["D"]["id"]]


def test_diamond_passes_results_along(tmp_path):
    result = run_fixture("dag-diamond", tmp_path)
    assert result.node("dag-diamond.B")["outputs"]["result"] == "B-after-A"
    assert result.node("dag-diamond.D")["outputs"]["result"] == "B-after-A+C"
    times = {n["displayName"]: n["local"] for n in result.nodes.values() if n["type"] == "Pod"}
    assert times["D"]["startedAtUnix"] >= max(
        times["B"]["finishedAtUnix"], times["C"]["finishedAtUnix"]
    )


def test_steps_run_groups_in_order_with_parallel_steps(tmp_path):
    result = run_fixture("steps", tmp_path, arguments={"greeting": "hi"})
    assert result.phase == "Succeeded"
    join = result.node("steps[2].join")
    assert join["outputs"]["result"] == "hi1-2a,hi1-2b in steps"
    assert result.node("steps[1]")["type"] == "StepGroup"
    a, b = result.node("steps[1].hello2a"), result.node("steps[1].hello2b")
    first = result.node("steps[0].hello1")
    assert (
        min(a["local"]["startedAtUnix"], b["local"]["startedAtUnix"])
        >= first["local"]["finishedAtUnix"]
    )
    assert result.node("steps[1].hello2a")["inputs"]["parameters"] == [
        {"name": "message", "value": "hi1-2a"}
    ]


def test_loops_expand_items_sequences_and_params_and_aggregate(tmp_path):
    result = run_fixture("loops", tmp_path)
    assert result.phase == "Succeeded"
    assert result.node("loops.plain")["type"] == "TaskGroup"
    assert [result.node(f"loops.plain({i}:{w})")["outputs"]["result"] for i, w in
            enumerate(["alpha", "beta", "gamma"])] == ["alpha", "beta", "gamma"]  # fmt: skip
    assert (
        result.node("loops.maps(1:os:ubuntu,version:24.04)")["outputs"]["result"] == "ubuntu-24.04"
    )
    assert result.node("loops.maps(0:os:debian,version:12)")["outputs"]["result"] == "debian-12"
    assert [result.node(f"loops.seq({i}:{n})")["outputs"]["result"] for i, n in
            enumerate(["02", "03", "04"])] == ["n02", "n03", "n04"]  # fmt: skip
    squares = [result.node(f"loops.square({i}:{n})") for i, n in enumerate([1, 2, 3])]
    assert [s["outputs"]["result"] for s in squares] == ["1", "4", "9"]
    # the shell drops the JSON quotes of the aggregated parameters: ["2","4","6"] -> [2,4,6]
    assert result.node("loops.fan-in")["outputs"]["result"] == "results=[1,4,9] params=[2,4,6]"
    assert result.node("loops.fan-in")["inputs"]["parameters"][0]["value"] == (
        'results=[1,4,9] params=["2","4","6"]'
    )


def test_output_parameters_from_files_global_and_dag_outputs(tmp_path):
    result = run_fixture("outputs", tmp_path)
    assert result.phase == "Succeeded", result.message
    produce = result.node("outputs[0].inner.produce")
    assert produce["outputs"]["parameters"] == [
        {"name": "hello-param", "value": "hello world"},
        {"name": "fallback", "value": "none"},
    ]
    assert result.node("outputs[0].inner")["outputs"]["parameters"] == [
        {"name": "greeting", "value": "hello world"}
    ]
    assert result.node("outputs[1].consume")["outputs"]["result"] == "got: hello world/hello world"
    assert result.status["status"]["outputs"]["parameters"] == [
        {"name": "shared", "value": "hello world"}
    ]
    # /tmp of the template is private to the node, like a pod's
    private = Path(result.workdir) / "pods" / produce["id"] / "tmp" / "hello_world.txt"
    assert private.read_text() == "hello world"


def test_workflow_template_with_arguments_and_env(tmp_path):
    result = run_fixture("workflow-template", tmp_path, arguments={"who": "Ada"})
    assert result.phase == "Succeeded"
    assert result.name.startswith("workflow-template")
    root = result.node(result.name)
    assert root["outputs"]["result"] == "Hello Ada, you look happy"


@pytest.mark.parametrize("bad", [{"mood": "sad", "who": "x"}, {}])
def test_workflow_template_rejects_bad_arguments(tmp_path, bad):
    from ckptflow.workflows.runner import SpecError

    with pytest.raises(SpecError, match="mood|who"):
        run_fixture("workflow-template", tmp_path, arguments=bad)
    assert not (tmp_path / "run").exists()


def test_live_view_reads_training_progress_from_a_task_log(tmp_path):
    from ckptflow.workflows.runner.report import task_progress

    log = tmp_path / "rank0.log"
    log.write_bytes(
        b"x INFO step 100/800 train_loss 1.2 | 30.0 step/s, ETA 0:23\n"
        b"x INFO checkpoint 100 committed: full stall 0.02s\n"
        b"x INFO step 150/800 train_loss 1.1 | 31.0 step/s, ETA 0:21\n"
    )
    assert task_progress(str(log)) == "step 150/800, loss 1.1, checkpoint 100"
    assert task_progress(str(tmp_path / "missing.log")) == "" and task_progress(None) == ""


def test_off_a_terminal_training_progress_is_printed_as_plain_lines(tmp_path):
    """Issue 38 point 9: off a terminal (`make run | tee`, CI) a long training task printed
    nothing between its start and its end; now a plain line when its progress changed, at most
    once per `progress_every` seconds per task."""
    import io

    from ckptflow.workflows.runner.nodes import Node, NodeStore
    from ckptflow.workflows.runner.report import Reporter

    log = tmp_path / "rank0.log"
    log.write_bytes(b"x INFO step 100/800 train_loss 1.2 | 30.0 step/s, ETA 0:23\n")
    store = NodeStore("wf")
    node = Node("wf-1", "wf.pretrain.rank-0", "rank-0", "Pod", phase="Running")
    node.log_file = str(log)
    store.nodes[node.id] = node
    quiet = tmp_path / "rank1.log"  # a rank that logs only its commits prints no line of its own
    quiet.write_bytes(b"x INFO checkpoint 100 committed: full stall 0.02s\n")
    other = Node("wf-2", "wf.pretrain.rank-1", "rank-1", "Pod", phase="Running")
    other.log_file = str(quiet)
    store.nodes[other.id] = other
    out = io.StringIO()
    reporter = Reporter(stream=out, progress_every=0.0)
    reporter.store = store
    reporter.print_progress()
    reporter.print_progress()  # unchanged: no second line
    with open(log, "ab") as fh:
        fh.write(b"x INFO checkpoint 100 committed: full stall 0.02s\n")
    reporter.print_progress()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].endswith("progress  wf.pretrain.rank-0 step 100/800, loss 1.2")
    assert lines[1].endswith("step 100/800, loss 1.2, checkpoint 100")


def test_the_downward_api_gives_pod_and_node_names(tmp_path):
    import socket
    import sys

    env = [
        {"name": n, "valueFrom": {"fieldRef": {"fieldPath": p}}}
        for n, p in (("POD", "metadata.name"), ("NODE", "spec.nodeName"))
    ]
    script = "import os; print(os.environ['POD'], os.environ['NODE'])"
    manifest = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "downward"},
        "spec": {
            "entrypoint": "main",
            "templates": [
                {
                    "name": "main",
                    "container": {"command": [sys.executable, "-c", script], "env": env},
                }
            ],
        },
    }
    result = run_workflow(
        manifest, workdir=str(tmp_path / "run"), name="downward", stream=io.StringIO()
    )
    assert result.phase == "Succeeded", result.table
    pod, node = by_name(result, "downward")["outputs"]["result"].split()
    assert pod == by_name(result, "downward")["id"] and node == socket.gethostname()

"""Smaller features of the local runner, on inline manifests: the interpreter used for
`python`, template-level parallelism, daemons in steps with an HTTP probe, withParam from a
workflow parameter, the terminal view, and the import boundary (no hera, no torch)."""

from __future__ import annotations

import io
import socket
import subprocess
import sys
from pathlib import Path

from ckptflow.workflows.runner import run_workflow

REPO = Path(__file__).resolve().parents[2]


def workflow(entry: str, *templates: dict, **spec) -> dict:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": "inline-"},
        "spec": {"entrypoint": entry, "templates": list(templates), **spec},
    }


def sh(name: str, script: str, **extra) -> dict:
    return {
        "name": name,
        "container": {"image": "busybox", "command": ["sh", "-c"], "args": [script]},
        **extra,
    }


def run(manifest: dict, tmp_path: Path, **kwargs):
    return run_workflow(
        manifest, workdir=str(tmp_path / "w"), name="wf", stream=io.StringIO(), **kwargs
    )


def test_python_runs_with_the_current_interpreter(tmp_path):
    tmpl = {
        "name": "py",
        "container": {
            "image": "python:3.12",
            "command": ["python", "-c"],
            "args": ["import sys; print(sys.executable)"],
        },
    }
    result = run(workflow("py", tmpl), tmp_path)
    assert result.node("wf")["outputs"]["result"] == sys.executable


def test_script_template_and_working_dir(tmp_path):
    tmpl = {
        "name": "s",
        "script": {
            "image": "python",
            "command": ["python"],
            "workingDir": str(tmp_path),
            "source": "import os\nprint(os.getcwd())\n",
        },
    }
    result = run(workflow("s", tmpl), tmp_path)
    assert result.node("wf")["outputs"]["result"] == str(tmp_path)


def test_template_parallelism_limits_a_dag(tmp_path):
    trace = tmp_path / "trace"
    work = sh("work", f"echo start >> {trace}; sleep 0.2; echo end >> {trace}")
    dag = {
        "name": "main",
        "parallelism": 1,
        "dag": {"tasks": [{"name": f"t{i}", "template": "work"} for i in range(3)]},
    }
    result = run(workflow("main", dag, work), tmp_path)
    assert result.phase == "Succeeded"
    assert trace.read_text().split() == ["start", "end"] * 3


def test_daemon_step_with_http_probe_and_with_param(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = {
        "name": "server",
        "daemon": True,
        "container": {
            "image": "python",
            "command": ["python", "-m", "http.server", str(port), "--bind", "127.0.0.1"],
            "readinessProbe": {"httpGet": {"path": "/", "port": port}},
        },
    }
    client = {
        "name": "client",
        "inputs": {"parameters": [{"name": "path"}]},
        "container": {
            "image": "python",
            "command": ["python", "-c"],
            "args": [
                "import urllib.request, urllib.error\n"
                "try:\n"
                f"    urllib.request.urlopen('http://{{{{inputs.parameters.host}}}}:{port}/{{{{inputs.parameters.path}}}}')\n"
                "except urllib.error.HTTPError as e:\n"
                "    print(e.code)\n"
            ],
        },
    }
    client["inputs"]["parameters"].append({"name": "host"})
    main = {
        "name": "main",
        "steps": [
            [{"name": "srv", "template": "server"}],
            [
                {
                    "name": "get",
                    "template": "client",
                    "withParam": "{{workflow.parameters.paths}}",
                    "arguments": {
                        "parameters": [
                            {"name": "path", "value": "{{item}}"},
                            {"name": "host", "value": "{{steps.srv.ip}}"},
                        ]
                    },
                }
            ],
        ],
    }
    spec = {"arguments": {"parameters": [{"name": "paths", "value": '["missing-a", "missing-b"]'}]}}
    result = run(workflow("main", main, server, client, **spec), tmp_path)
    assert result.phase == "Succeeded", result.message
    assert result.node("wf[0].srv")["daemoned"] is True
    assert result.node("wf[1].get(0:missing-a)")["outputs"]["result"] == "404"
    assert result.node("wf[1].get(1:missing-b)")["outputs"]["result"] == "404"


def test_missing_input_is_an_error_node(tmp_path):
    needs = sh("needs", "echo {{inputs.parameters.x}}", inputs={"parameters": [{"name": "x"}]})
    main = {"name": "main", "dag": {"tasks": [{"name": "a", "template": "needs"}]}}
    result = run(workflow("main", main, needs), tmp_path)
    assert result.phase == "Error" and result.exit_code == 2
    assert "inputs.parameters.x was not supplied" in result.node("wf.a")["message"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_view_redraws(tmp_path):
    stream = _Terminal()
    manifest = workflow("s", sh("s", "sleep 0.7"))
    run_workflow(manifest, workdir=str(tmp_path / "w"), name="wf", stream=stream)
    out = stream.getvalue()
    assert "\x1b[1A" in out and "wf" in out and "Running:1" in out


RUNNER_ONLY = """
import importlib, pkgutil, sys
import ckptflow.workflows.runner as r
for m in pkgutil.iter_modules(r.__path__):
    importlib.import_module(f"{r.__name__}.{m.name}")
def foreign(m):
    top = m.split(".")[0]
    if top in ("hera", "torch"):
        return True
    inside = m in ("ckptflow", "ckptflow.workflows") or m.startswith(r.__name__)
    return top == "ckptflow" and not inside
print(sorted(m for m in list(sys.modules) if foreign(m)))
"""


def test_runner_imports_neither_hera_nor_torch_nor_the_rest_of_ckptflow():
    done = subprocess.run(
        [sys.executable, "-c", RUNNER_ONLY], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_volumes_claims_are_shared_and_empty_dirs_are_private(tmp_path):
    mounts = [
        {"name": "workspace", "mountPath": "/work"},
        {"name": "scratch", "mountPath": "/scratch"},
    ]
    volumes = [
        {"name": "scratch", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    writer = sh(
        "writer",
        "echo shared > /work/data.txt && echo mine > /scratch/own.txt && test -d /dev/shm",
        volumes=volumes,
    )
    writer["container"]["volumeMounts"] = [*mounts, {"name": "dshm", "mountPath": "/dev/shm"}]
    reader = sh("reader", "cat /work/data.txt; ls /scratch | wc -l", volumes=volumes)
    reader["container"]["volumeMounts"] = mounts
    main = {
        "name": "main",
        "steps": [[{"name": "w", "template": "writer"}], [{"name": "r", "template": "reader"}]],
    }
    claims = [{"metadata": {"name": "workspace"}, "spec": {"accessModes": ["ReadWriteOnce"]}}]
    result = run(workflow("main", main, writer, reader, volumeClaimTemplates=claims), tmp_path)
    assert result.phase == "Succeeded", result.message
    assert result.node("wf[1].r")["outputs"]["result"].split() == ["shared", "0"]
    assert (tmp_path / "w" / "volumes" / "workspace" / "data.txt").read_text() == "shared\n"
    assert not Path("/work/data.txt").exists()


def test_secret_env_comes_from_the_given_environment(tmp_path):
    tmpl = sh("s", "echo $TOKEN-$PLAIN")
    tmpl["container"]["env"] = [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
        {"name": "PLAIN", "value": "v"},
    ]
    result = run(workflow("s", tmpl), tmp_path, env={"TOKEN": "t0k", "PATH": "/usr/bin:/bin"})
    assert result.node("wf")["outputs"]["result"] == "t0k-v"


def test_workflow_retry_strategy_is_the_default_for_leaf_templates(tmp_path):
    counter = tmp_path / "n"
    flaky = sh(
        "flaky",
        f"n=$(cat {counter} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {counter}; [ $n -ge 2 ]",
    )
    main = {"name": "main", "steps": [[{"name": "f", "template": "flaky"}]]}
    result = run(workflow("main", main, flaky, retryStrategy={"limit": 3}), tmp_path)
    assert result.phase == "Succeeded"
    assert result.node("wf")["type"] == "Steps"
    assert (
        result.node("wf[0].f")["type"] == "Retry" and len(result.node("wf[0].f")["children"]) == 2
    )


def test_dag_when_skips_and_dependents_still_run(tmp_path):
    skipped = {"name": "maybe", "template": "echo", "when": "{{workflow.parameters.go}} == yes"}
    after = {"name": "after", "template": "echo", "depends": "maybe"}
    only_if_ran = {"name": "only-if-ran", "template": "echo", "depends": "maybe.Succeeded"}
    main = {"name": "main", "dag": {"tasks": [skipped, after, only_if_ran]}}
    echo = sh(
        "echo",
        "echo {{inputs.parameters.msg}}",
        inputs={"parameters": [{"name": "msg", "default": "{{workflow.name}}"}]},
    )
    spec = {"arguments": {"parameters": [{"name": "go", "value": "no"}]}}
    result = run(workflow("main", main, echo, **spec), tmp_path)
    assert result.phase == "Succeeded"
    assert result.node("wf.maybe")["phase"] == "Skipped"
    assert result.node("wf.after")["outputs"]["result"] == "wf"
    assert result.node("wf.only-if-ran")["phase"] == "Omitted"


def test_a_command_that_cannot_start_is_an_error_and_retried_under_always(tmp_path):
    # a path: a bare name that is not on PATH is refused before anything runs (test_runner_breadth)
    missing = {"name": "m", "container": {"command": ["/no-such-dir/ckptflow-cmd"], "args": []}}
    missing["retryStrategy"] = {"limit": 1, "retryPolicy": "Always"}
    result = run(workflow("m", missing), tmp_path)
    assert result.phase == "Error" and result.exit_code == 2
    attempts = [result.node(f"wf({i})") for i in range(2)]
    assert all(a["phase"] == "Error" and "failed to start" in a["message"] for a in attempts)

"""Processes under the local runner: daemons reached by IP, deadlines, parallelism, and
nothing left running after a deadline or a Ctrl-C."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ckptflow.workflows.runner import load_manifest, run_workflow

FIXTURES = Path(__file__).parent / "fixtures" / "runner"
REPO = Path(__file__).resolve().parents[2]


def load(name: str) -> dict:
    return load_manifest(str(FIXTURES / f"{name}.yaml"))


def run(manifest: dict, tmp_path: Path, name: str, **kwargs):
    return run_workflow(
        manifest, workdir=str(tmp_path / name), name=name, stream=io.StringIO(), **kwargs
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def wait_dead(pid: int, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_daemon_is_reached_by_ip_and_stopped_with_its_dag(tmp_path):
    port = free_port()
    result = run(load("daemon"), tmp_path, "daemon", arguments={"port": str(port)})
    assert result.phase == "Succeeded", result.message
    server, client = result.node("daemon.server"), result.node("daemon.client")
    assert client["outputs"]["result"] == "200"
    assert client["inputs"]["parameters"] == [{"name": "url", "value": f"http://127.0.0.1:{port}/"}]
    assert server["daemoned"] is True and server["phase"] == "Succeeded"
    assert server["local"]["finishedAtUnix"] >= client["local"]["finishedAtUnix"]
    with socket.socket() as s:  # the server is gone once the DAG ended
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_deadlines_fail_tasks_and_kill_processes(tmp_path):
    pidfile = tmp_path / "pid"
    t0 = time.monotonic()
    result = run(load("deadlines"), tmp_path, "dl", arguments={"pidfile": str(pidfile)})
    elapsed = time.monotonic() - t0
    assert result.phase == "Failed" and result.message == "Max duration limit exceeded"
    bounded, endless = result.node("dl.bounded"), result.node("dl.endless")
    assert bounded["phase"] == "Failed"
    assert bounded["message"] == "Pod was active on the node longer than the specified deadline"
    assert bounded["local"]["finishedAtUnix"] - bounded["local"]["startedAtUnix"] < 2.5
    assert endless["phase"] == "Failed" and endless["message"] == "Step exceeded its deadline"
    assert elapsed < 8
    assert wait_dead(int(pidfile.read_text()))


def test_workflow_parallelism_limits_concurrent_processes(tmp_path):
    trace = tmp_path / "trace"
    result = run(load("parallelism"), tmp_path, "par", arguments={"trace": str(trace)})
    assert result.phase == "Succeeded"
    events = sorted(
        (float(t), +1 if kind == "start" else -1)
        for kind, t in (line.split() for line in trace.read_text().splitlines())
    )
    running, peak = 0, 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    assert len(events) == 8 and peak == 2


def test_ctrl_c_stops_every_process(tmp_path):
    pidfile = tmp_path / "pid"
    cmd = [sys.executable, "-m", "ckptflow.cli", "run", str(FIXTURES / "interrupt.yaml"),
           "-p", f"pidfile={pidfile}", "--workdir", str(tmp_path / "w")]  # fmt: skip
    runner = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    end = time.monotonic() + 20
    while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < end:
        time.sleep(0.05)
    sleeper = int(pidfile.read_text())
    assert alive(sleeper)
    os.kill(runner.pid, signal.SIGINT)
    out, _ = runner.communicate(timeout=20)
    assert runner.returncode == 130
    assert "interrupted" in out
    assert wait_dead(sleeper)


def test_status_file_is_live_while_running(tmp_path):
    import json
    import threading

    manifest = {
        "metadata": {"name": "live"},
        "spec": {
            "entrypoint": "s",
            "templates": [
                {"name": "s", "container": {"command": ["sh", "-c"], "args": ["sleep 1.5"]}}
            ],
        },
    }
    status = tmp_path / "status.json"
    done = {}
    t = threading.Thread(
        target=lambda: done.update(
            r=run_workflow(
                manifest, workdir=str(tmp_path / "w"), status_file=str(status), stream=io.StringIO()
            )
        )
    )
    t.start()
    end = time.monotonic() + 5
    seen = None
    while time.monotonic() < end and seen is None:
        if status.exists():
            doc = json.loads(status.read_text())
            if doc["status"]["nodes"].get("live", {}).get("phase") == "Running":
                seen = doc
        time.sleep(0.05)
    t.join(timeout=10)
    assert seen is not None and seen["status"]["phase"] == "Running"
    assert json.loads(status.read_text())["status"]["phase"] == "Succeeded"
    assert done["r"].phase == "Succeeded"


def test_pipeline_shaped_workflow(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    port = free_port()
    manifest = load("pipeline-like")
    result = run(manifest, tmp_path, "pl", arguments={"run-root": str(root), "port": str(port)})
    assert result.phase == "Succeeded", result.message
    assert result.status["status"]["outputs"]["parameters"] == [
        {"name": "mlflow_run_id", "value": "run-pl"}
    ]
    assert result.node("pl.pretrain.rdzv")["daemoned"] is True
    rank1 = result.node("pl.pretrain.rank(1:1)")
    assert rank1["type"] == "Retry" and len(rank1["children"]) == 2
    assert result.node("pl.pretrain.rank(1:1)(0)")["message"] == "Error (exit code 1)"
    assert (root / "rank-0.done").read_text() == "welcome"
    assert result.node("pl.pretrain.evaluate")["outputs"]["result"] == "rank-0.done,rank-1.done"
    assert result.node("pl.pretrain")["outputs"]["parameters"] == [
        {"name": "last_steps", "value": '["100","101"]'}
    ]
    assert (root / "finished.txt").read_text() == "run-pl Succeeded\n"
    attempt = result.node("pl.pretrain.rank(0:0)(0)")
    private = Path(result.workdir) / "pods" / attempt["id"] / "tmp" / "outputs" / "last_step"
    assert private.read_text() == "100"  # `--output-dir /tmp/outputs` was the node's own
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0

"""`run_workflow(isolate=True)` / `ckptflow run FILE --isolate`: every task a pod (root).

The fixture `isolate.yaml` checks from inside the pods what a cluster gives them: an IP of
their own (a daemon reached at `{{tasks.X.ip}}`), a private loopback, /tmp and hostname, the
downward API, volumes as real mounts. Skipped with `available()`'s reason where pods cannot
work (CI runs as root, where test_pods_node.py insists they do).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ckptflow.workflows.runner import isolation, load_manifest, run_workflow
from ckptflow.workflows.runner.pods import PREFIX, available, leftovers
from ckptflow.workflows.runner.pods.naming import PID_DIGITS, base36

from ckptflow import run_cli

FIXTURES = Path(__file__).parent / "fixtures" / "runner"
REPO = Path(__file__).resolve().parents[2]
WHY = available()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"pods unavailable: {WHY}")


def mine(pid: int) -> str:
    """The tag prefix of the pod nodes a process owns."""
    return PREFIX + base36(pid, PID_DIGITS)


def nothing_left(pid: int) -> None:
    left = {k: v for k, v in leftovers(mine(pid)).items() if v}
    assert not left, left


def run(manifest: dict, tmp_path: Path, name: str, **kw):
    return run_workflow(
        manifest, workdir=str(tmp_path / name), name=name, stream=io.StringIO(), isolate=True, **kw
    )


def log(result, display: str) -> str:
    return Path(result.node(display)["local"]["logFile"]).read_text()


def leaf(name: str, script: str, **container) -> dict:
    """A one-template workflow running `python -c script`."""
    body = {"command": ["python", "-c", script], **container}
    return {
        "metadata": {"name": name},
        "spec": {"entrypoint": "t", "templates": [{"name": "t", "container": body}]},
    }


def test_tasks_are_pods_with_their_own_network_tmp_hostname_and_volumes(tmp_path):
    result = run(load_manifest(str(FIXTURES / "isolate.yaml")), tmp_path, "iso")
    assert result.phase == "Succeeded", result.table
    ips = {d: result.node(d)["podIP"] for d in ("server", "local", "client", "me", "other", "vols")}
    assert len(set(ips.values())) == len(ips), ips  # one IP per pod, none is 127.0.0.1
    assert all(ip.startswith("10.244.") for ip in ips.values()), ips
    assert log(result, "client").strip() == "pong"  # the daemon, at {{tasks.server.ip}}
    me = json.loads(log(result, "me"))
    assert me["POD_IP"] == ips["me"] == result.node("me")["outputs"]["parameters"][0]["value"]
    assert me["POD_NAME"] == me["hostname"] == result.node("me")["id"]
    assert (me["POD_NAMESPACE"], me["TEAM"], me["NOTE"]) == ("default", "ckpt", "hello")
    other = json.loads(log(result, "other"))
    # me's /tmp file, me's hostname and local's loopback server are all out of reach
    assert other == {"sees_tmp": False, "resolves": False, "reaches_local": False}
    vols = json.loads(log(result, "vols"))
    points = {m[0]: m for m in vols["mounts"]}  # the last mount at a path is the visible one
    assert "/data" in points and vols["data"] == "written"
    assert points["/dev/shm"][1] == "tmpfs" and "size=8192k" in points["/dev/shm"][2]
    assert points["/tmp"][1] == "tmpfs"
    assert vols["shm_full"]  # 16 MiB do not fit in the 8Mi sizeLimit
    nothing_left(os.getpid())


def test_a_pod_over_its_memory_limit_is_oom_killed(tmp_path):
    grab = "x = bytearray(256 << 20); x[::4096] = b'1' * len(x[::4096])"
    wf = leaf("oom", grab, resources={"limits": {"memory": "32Mi"}})
    result = run(wf, tmp_path, "oom")
    node = result.node("oom")
    assert result.phase == "Failed"
    assert node["phase"] == "Failed" and node["local"]["exitCode"] == 137
    assert node["message"] == "OOMKilled (exit code 137)"
    nothing_left(os.getpid())


def test_every_retry_gets_a_new_ip_and_outputs_come_from_the_pods_tmp(tmp_path):
    script = (
        "import os, sys; os.makedirs('/tmp/o', exist_ok=True); "
        "open('/tmp/o/ip', 'w').write(os.environ['IP']); sys.exit(0 if {{retries}} else 3)"
    )
    wf = leaf(
        "retry",
        script,
        env=[{"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
    )
    tmpl = wf["spec"]["templates"][0]
    tmpl["retryStrategy"] = {"limit": 2}
    tmpl["outputs"] = {"parameters": [{"name": "ip", "valueFrom": {"path": "/tmp/o/ip"}}]}
    result = run(wf, tmp_path, "retry")
    assert result.phase == "Succeeded", result.table
    first, second = result.node("retry(0)"), result.node("retry(1)")
    assert first["podIP"] != second["podIP"]
    assert second["outputs"]["parameters"] == [{"name": "ip", "value": second["podIP"]}]
    assert not (Path("/tmp/o/ip").exists() and Path("/tmp/o/ip").read_text() == second["podIP"])


def test_a_script_and_a_claim_are_mounted_at_their_paths(tmp_path):
    wf = {
        "metadata": {"name": "claim"},
        "spec": {
            "entrypoint": "main",
            "volumeClaimTemplates": [{"metadata": {"name": "work"}}],
            "templates": [
                {"name": "main", "steps": [[{"name": "w", "template": "w"}], [{"name": "r", "template": "r"}]]},
                {"name": "w", "script": {"command": ["python"], "source": "open('/work-claim/f', 'w').write('kept')",
                                         "volumeMounts": [{"name": "work", "mountPath": "/work-claim"}]}},
                {"name": "r", "script": {"command": ["python"], "source": "print(open('/work-claim/f').read())",
                                         "volumeMounts": [{"name": "work", "mountPath": "/work-claim"}]}},
            ],
        },
    }  # fmt: skip
    result = run(wf, tmp_path, "claim")
    assert result.phase == "Succeeded", result.table
    assert result.node("r")["outputs"]["result"] == "kept"  # shared by the run, as a claim
    assert not Path("/work-claim").exists()  # a mount in the pods only, never on the host


def test_isolate_where_pods_cannot_work_is_one_line_and_exit_2(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(isolation, "available", lambda: "pods need root; run as root")
    wf = tmp_path / "wf.yaml"
    wf.write_text(json.dumps(leaf("x", "print(1)")))
    rc = run_cli.main([str(wf), "--isolate", "--workdir", str(tmp_path / "w")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.strip().count("\n") == 0 and "pods need root" in err and "--isolate" in err


def test_ctrl_c_of_ckptflow_run_isolate_leaves_nothing(tmp_path):
    wf = tmp_path / "wf.yaml"
    wf.write_text(
        json.dumps(leaf("long", "import os, time; print(os.getpid(), flush=True); time.sleep(120)"))
    )
    workdir = tmp_path / "w"
    runner = subprocess.Popen(
        [sys.executable, "-m", "ckptflow.cli", "run", str(wf), "--isolate", "--workdir", str(workdir)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    logfile = workdir / "logs" / "long.log"
    deadline = time.monotonic() + 60
    while not (logfile.exists() and logfile.read_text().strip()):
        assert runner.poll() is None and time.monotonic() < deadline, runner.stdout.read()
        time.sleep(0.1)
    task_pid = int(logfile.read_text().split()[0])
    assert any(leftovers(mine(runner.pid)).values())  # the pod exists while it runs
    os.kill(runner.pid, signal.SIGINT)
    out, _ = runner.communicate(timeout=30)
    assert runner.returncode == 130, out
    assert (
        not Path(f"/proc/{task_pid}").exists() or "Z" in Path(f"/proc/{task_pid}/stat").read_text()
    )
    nothing_left(runner.pid)


def test_a_secret_reference_reaches_only_the_pods_that_name_it(tmp_path):
    show = "import os; print(os.environ.get('KEY', '-'))"
    ref = {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
    wf = {
        "metadata": {"name": "sec"},
        "spec": {
            "entrypoint": "main",
            "templates": [
                {"name": "main", "steps": [[{"name": "a", "template": "a"}, {"name": "b", "template": "b"}]]},
                {"name": "a", "container": {"command": ["python", "-c", show], "env": [ref]}},
                {"name": "b", "container": {"command": ["python", "-c", show]}},
            ],
        },
    }  # fmt: skip
    result = run(wf, tmp_path, "sec", env={**os.environ, "KEY": "s3cret"})
    assert result.phase == "Succeeded", result.table
    assert result.node("a")["outputs"]["result"] == "s3cret"
    assert result.node("b")["outputs"]["result"] == "-"


def test_resource_limits_are_the_pods_cgroup_limits(tmp_path):
    script = (
        "import json\n"
        "own = dict(l.strip().split(':', 2)[1:] for l in open('/proc/self/cgroup'))\n"
        "def read(ctl, f): return int(open(f'/sys/fs/cgroup/{ctl}{own[ctl]}/{f}').read())\n"
        "print(json.dumps([read('memory', 'memory.limit_in_bytes'), read('cpu', 'cpu.cfs_quota_us'),"
        " read('cpu', 'cpu.cfs_period_us')]))"
    )
    wf = leaf("limits", script, resources={"limits": {"memory": "96Mi", "cpu": "250m"}})
    result = run(wf, tmp_path, "limits")
    assert result.phase == "Succeeded", result.table
    memory, quota, period = json.loads(result.node("limits")["outputs"]["result"])
    assert memory == 96 << 20 and quota == period // 4

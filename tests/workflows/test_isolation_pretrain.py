"""The cluster defect of issue 15, on pods: rank pods form their process group only when
torchrun publishes the pod's IP (PET_LOCAL_ADDR from status.podIP), not its hostname.

The rendered pretrain-only workflow (2 ranks, 4 steps, CPU) runs under isolation as
`ckptflow run pretrain --local --isolate` runs it: the in-process S3 and a real MLflow server
on the pods' bridge, all checkpoints through S3. Slow (a minute or two each).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from ckptflow.workflows.runner.pods import PREFIX, available, leftovers
from ckptflow.workflows.runner.pods.naming import PID_DIGITS, base36

from tests.workflows.isolated import run_isolated

WHY = available()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(WHY is not None, reason=f"pods unavailable: {WHY}"),
]
SMALL = [
    "pretrain.max_steps=4",
    "pretrain.ckpt_every=2",
    "pretrain.retries=0",
    "pretrain.rdzv_join_timeout_s=60",
]


def _without_local_addr(manifest: dict) -> None:
    """The rank template as it was before the fix: no PET_LOCAL_ADDR."""
    for tmpl in manifest["spec"]["templates"]:
        env = (tmpl.get("container") or {}).get("env") or []
        tmpl.get("container", {})["env"] = [e for e in env if e["name"] != "PET_LOCAL_ADDR"]


def _run_pretrain(tmp_path: Path, name: str, deadline_s: int, edit=None):
    overrides = [*SMALL, f"pretrain.timeout={deadline_s}"]
    out = run_isolated(tmp_path, name, overrides, edit=edit)
    return out.result, out.text


def _ranks(result) -> list[dict]:
    return [n for n in result.nodes.values() if n["displayName"].startswith("rank(")]


def test_without_the_pod_ip_the_ranks_cannot_rendezvous(tmp_path):
    result, _ = _run_pretrain(tmp_path, "pre-nofix", 45, edit=_without_local_addr)
    assert result.phase == "Failed"
    ranks = _ranks(result)
    assert len(ranks) == 2 and all(r["phase"] == "Failed" for r in ranks), result.table
    logs = "".join(Path(r["local"]["logFile"]).read_text() for r in ranks)
    assert "name resolution" in logs  # a rank's hostname, published for the workers' store


def test_pretrain_ranks_form_their_group_across_pods(tmp_path):
    result, text = _run_pretrain(tmp_path, "pre-fix", 300)
    assert result.phase == "Succeeded", result.table
    ips = {r["podIP"] for r in _ranks(result)}
    assert len(ips) == 2 and not any(ip.startswith("127.") for ip in ips)
    assert "pretrain: 2 committed checkpoints  (s3://" in text, text  # through S3 only
    assert (tmp_path / "pre-fix" / "mlflow" / "mlflow.db").stat().st_size > 0


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if text.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
    return found


def test_ctrl_c_of_run_pipeline_local_isolate_stops_pods_and_services(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    runs = tmp_path / "runs"
    runner = subprocess.Popen(
        [sys.executable, "-m", "ckptflow.cli", "run", "pretrain", "--local", "--isolate",
         "--runs-dir", str(runs), "--name", "pre-int", *(f"--set={s}" for s in SMALL)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    logs = runs / "pre-int" / "argo" / "logs"
    deadline = time.monotonic() + 240
    while not any(logs.glob("*rank*")):  # the ranks run: pods, S3 and MLflow are all up
        assert runner.poll() is None and time.monotonic() < deadline, runner.stdout.read()
        time.sleep(0.2)
    assert _processes_mentioning(str(runs / "pre-int" / "mlflow"))  # the tracking server
    os.kill(runner.pid, signal.SIGINT)
    out, _ = runner.communicate(timeout=60)
    assert runner.returncode == 130, out
    left = {k: v for k, v in leftovers(PREFIX + base36(runner.pid, PID_DIGITS)).items() if v}
    assert not left, left
    end = time.monotonic() + 10
    while _processes_mentioning(str(runs / "pre-int")) and time.monotonic() < end:
        time.sleep(0.2)
    assert not _processes_mentioning(str(runs / "pre-int"))  # no server, no pod left running

"""A killed and resumed pretraining leaves one measured recovery in its checkpoint root, and
`ckptflow ckpt stats --json` reports it (issue 34)."""

from __future__ import annotations

import json
import subprocess
import sys

from ckptflow.steps.lib.loop import KILLED_EXIT

from ckptflow import cli

ARGV = [
    "--max-steps", "10", "--ckpt-every", "4", "--batch-size", "4", "--seq-len", "16",
    "--log-every", "100", "--preflight-factor", "0", "--no-async-save",
]  # fmt: skip


def pretrain(root: str, *extra: str) -> int:
    cmd = [sys.executable, "-m", "ckptflow.steps.pretrain", "--run-root", root, *ARGV, *extra]
    return subprocess.run(cmd, capture_output=True, timeout=300).returncode


def test_a_resumed_run_reports_its_measured_recovery(tmp_path, capsys):
    root = str(tmp_path / "run")
    assert pretrain(root, "--fail-at-step", "6") == KILLED_EXIT
    assert pretrain(root) == 0
    assert cli.main(["ckpt", "stats", f"{root}/ckpt", "--json"]) == 0
    (rec,) = json.loads(capsys.readouterr().out)["recoveries"]["measured"]
    assert rec["resumed_step"] == 4  # the newest valid step before the kill
    assert 1 <= rec["last_step"] <= 6 and rec["recovery_s"] > 0
    assert rec["source"] == "store" and rec["store_bytes"] > 0  # no local tier (issue 35)
    assert cli.main(["ckpt", "stats", f"{root}/ckpt"]) == 0
    assert "recovery 1" in capsys.readouterr().out

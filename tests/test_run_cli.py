"""`ckptflow run`: a manifest file goes to the local runner (exit code from the phase, 3 for a
refused manifest); a builder name with `--local` goes to `ckptflow.workflows.local`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ckptflow.run_cli import main

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "workflows" / "fixtures" / "runner"


def test_cli_runs_a_file_and_maps_phase_to_exit_code(tmp_path):
    status = tmp_path / "status.json"
    cmd = [sys.executable, "-m", "ckptflow.cli", "run", str(FIXTURES / "steps.yaml"),
           "-p", "greeting=yo", "--workdir", str(tmp_path / "w"), "--status-file", str(status)]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "TASK" in done.stdout and "Succeeded" in done.stdout
    assert "started" in done.stderr  # plain progress lines when not on a terminal
    assert status.exists()
    failing = [sys.executable, "-m", "ckptflow.cli", "run", str(FIXTURES / "fail-fast.yaml"),
               "--workdir", str(tmp_path / "f")]  # fmt: skip
    assert subprocess.run(failing, cwd=REPO, capture_output=True, timeout=60).returncode == 1
    refused = [sys.executable, "-m", "ckptflow.cli", "run", str(FIXTURES / "refused.yaml")]
    done = subprocess.run(refused, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and "resource templates" in done.stderr


def test_run_builder_name_reaches_the_local_runner_hook(capsys):
    assert main(["pipeline", "--set", "pretrain.rnks=2", "--local"]) == 2
    assert "did you mean pretrain.ranks" in capsys.readouterr().err


def test_run_cli_imports_neither_hera_nor_torch():
    code = "import sys, ckptflow.run_cli; print(sorted(m for m in ('hera', 'torch') if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "[]", done.stderr

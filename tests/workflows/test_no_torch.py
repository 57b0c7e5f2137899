"""`workflows/` is hera-only: importing and rendering never loads torch (or steps)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import importlib, pkgutil, sys
import ckptflow.workflows
names = [m.name for m in pkgutil.walk_packages(ckptflow.workflows.__path__, "ckptflow.workflows.")]
for name in names:
    importlib.import_module(name)
from ckptflow.workflows.render import BUILDER_NAMES, config, manifests
for name in BUILDER_NAMES:
    manifests(name, config())
from ckptflow.cli import main
assert main(["render", "pipeline", "-o", sys.argv[1]]) == 0
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "ckptflow.steps", "steps", "workflows")))
print(len(names), loaded)
"""


def test_workflows_never_import_torch(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "p.yaml")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    count, loaded = out.stdout.split(" ", 1)
    assert int(count) >= 8  # every workflows module was imported
    assert loaded.strip() == "[]", f"workflows imported {loaded}"

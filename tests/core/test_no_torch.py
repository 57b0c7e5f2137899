"""The format core is torch-free and hera-free: statically (every import in ckptflow/core, at
module and function level) and in use (`ckptflow ckpt ...` on a real root never loads torch)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_layering import imports_of

REPO = Path(__file__).resolve().parents[2]
CORE = REPO / "ckptflow" / "core"
# the core, the one env reader, and the two CLIs over them (ckpt, plan)
BOTTOM = sorted(CORE.glob("*.py")) + [
    REPO / "ckptflow" / f for f in ("env.py", "ckpt_cli.py", "ckpt_ops_cli.py", "plan_cli.py")
]
FORBIDDEN = ("torch", "hera", "ckptflow.steps", "ckptflow.workflows")


def module_of(path: Path) -> str:
    package = "ckptflow.core" if path.parent == CORE else "ckptflow"
    return f"{package}.{path.stem}"


def test_the_core_checks_every_module():
    assert {p.stem for p in CORE.glob("*.py")} >= {
        "manifest",
        "storage",
        "runroot",
        "rootreader",
        "listing",
        "gc",
    }


@pytest.mark.parametrize("path", BOTTOM, ids=lambda p: p.relative_to(REPO).as_posix())
def test_core_modules_import_no_torch_hera_steps_or_workflows(path):
    bad = sorted(
        m
        for m in imports_of(path, module_of(path))
        for f in FORBIDDEN
        if m == f or m.startswith(f + ".")
    )
    assert not bad, f"{path.relative_to(REPO)} imports {bad}"


PROBE = """
import json, sys
from ckptflow.cli import main
rc = main(json.loads(sys.argv[1]))
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "hera")
               or m.startswith(("ckptflow.steps", "ckptflow.workflows")))
print(json.dumps({"rc": rc, "torch": "torch" in sys.modules, "heavy": heavy[:10]}))
"""


@pytest.fixture
def small_root(tmp_path):
    """A real root: a full step, a delta, an evaluation and a pin."""
    import torch
    from ckptflow.steps.checkpoint import Checkpointer

    from ckptflow.core import runroot

    root = str(tmp_path / "ckpt")
    ck = Checkpointer(root, full_every=2)
    for step in (1, 2, 3):
        ck.save(step, {"w": torch.full((64,), float(step)), "step": step})
    runroot.write_eval(ck.storage, runroot.EvalRecord(2, metrics={"val_loss": 0.5}))
    runroot.pin(ck.storage, 1, "kept")
    return root


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize(
    "argv",
    [
        ["ls", "{root}"],
        ["ls", "{root}", "--json", "--verify"],
        ["verify", "{root}", "--all"],
        ["pin", "{root}", "3", "--reason", "probe"],
        ["unpin", "{root}", "3"],
        ["gc", "{root}", "--policy", "last=1", "--grace", "0"],
        ["gc", "{root}", "--policy", "last=1", "--grace", "0", "--yes"],
        ["archive", "{root}", "--older-than", "0", "--to", "{archive}", "--grace", "0", "--yes"],
        ["slim", "{root}", "--older-than", "0", "--keep", "w", "step", "--yes"],
        ["stats", "{root}", "--json"],
    ],
    ids=lambda a: " ".join(x for x in a if not x.startswith("{")),
)
def test_ckpt_commands_never_import_torch(small_root, tmp_path, argv):
    args = ["ckpt", *(a.format(root=small_root, archive=tmp_path / "arch") for a in argv)]
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["rc"] == 0, out.stdout + out.stderr
    assert not result["torch"] and result["heavy"] == [], result

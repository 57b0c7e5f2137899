"""`ckptflow ckpt inspect ROOT STEP` and `ckptflow ckpt ls --help` (ckptflow.inspect_cli)."""

from __future__ import annotations

import json

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer

from ckptflow.ckpt_cli import main
from ckptflow.core import runroot
from ckptflow.core.storage import Storage

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _root(tmp_path) -> str:
    root = str(tmp_path / "ckpt")
    ck = Checkpointer(root, full_every=3)
    w = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    ck.save(1, {"model.w": w, "ids": torch.arange(16), "lr": 0.01})
    w[0, 0] += 1  # one element changes: the delta stores little, and needs its base
    ck.save(2, {"model.w": w, "ids": torch.arange(16), "lr": 0.02})
    ck.close()
    runroot.write_eval(Storage(root), runroot.EvalRecord(2, metrics={"val_loss": 1.25}))
    return root


def test_inspect_shows_tensors_values_and_metadata_of_one_step(tmp_path, capsys):
    root = _root(tmp_path)
    rc, out, err = run(capsys, "inspect", root, 2, "--json")
    assert rc == 0, err
    got = json.loads(out)
    assert got["step"] == 2 and got["kind"] == "delta" and got["base_step"] == 1
    w = got["tensors"]["model.w"]
    assert (w["shape"], w["dtype"], w["raw_bytes"]) == ([8, 4], "float32", 8 * 4 * 4)
    assert w["stored_bytes"] > 0 and w["base_bytes"] > 0  # a delta needs its base's bytes
    assert got["tensors"]["ids"]["dtype"] == "int64" and got["tensors"]["ids"]["shape"] == [16]
    assert list(got["values"]) == ["lr"] and got["values"]["lr"]["stored_bytes"] > 0
    assert got["metadata"] == {} and got["metrics"] == {"val_loss": 1.25}
    assert got["stats"]["raw_bytes"] >= 8 * 4 * 4 + 16 * 8
    full = json.loads(run(capsys, "inspect", root, 1, "--json")[1])
    # small parts share one pack object: each entry counts its own span, not the whole pack
    own = sum(e["stored_bytes"] for e in [*full["tensors"].values(), *full["values"].values()])
    assert own == full["stats"]["stored_bytes"], full
    rc, text, _ = run(capsys, "inspect", root, 2)
    assert rc == 0
    line = next(s for s in text.splitlines() if s.lstrip().startswith("model.w"))
    assert "float32" in line and "[8, 4]" in line, line
    assert "lr" in text and "val_loss=1.25" in text and "delta of step 1" in text


@pytest.mark.parametrize(
    ("where", "step", "phrase"),
    [
        ("root", 7, "step 7 has no committed checkpoint"),
        ("none", 1, "no checkpoints there"),
        ("file", 1, "give its folder"),
    ],
)
def test_inspect_refuses_a_bad_root_or_step_in_one_line(tmp_path, capsys, where, step, phrase):
    root = _root(tmp_path)
    target = {"root": root, "none": str(tmp_path / "nothing"), "file": f"{root}/ckptflow-root.json"}
    rc, out, err = run(capsys, "inspect", target[where], step)
    assert rc == 2 and phrase in err and err.count("\n") == 1 and not out, err


def test_inspect_reads_the_manifest_with_the_validating_reader(tmp_path, capsys):
    """A damaged manifest is reported naming the file (exit 1), never half-printed."""
    root = _root(tmp_path)
    manifest = next((tmp_path / "ckpt" / "step-00000002").glob("manifest-*.json"))
    manifest.write_bytes(manifest.read_bytes().replace(b'"float32"', b'"float99"'))
    rc, out, err = run(capsys, "inspect", root, 2)
    assert rc == 1 and str(manifest.name) in err and not out, err


def test_ls_help_explains_the_size_columns(capsys):
    assert main(["ls", "--help"]) == 0
    out = capsys.readouterr().out
    for column in ("LOGICAL", "STORED", "NEW", "RATIO", "KIND"):
        assert f"{column} " in out, column
    assert "delta<N" in out and "base" in out

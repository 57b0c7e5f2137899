"""A path that is not a checkpoint root is named for what it is, with the root to give."""

from __future__ import annotations

import struct

from ckptflow.core import rootguess
from ckptflow.core.storage import Storage


def test_files_are_named_by_their_first_bytes(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"PK\x03\x04" + b"\0" * 40)  # torch.save's zip
    header = b'{"w":{}}'
    (tmp_path / "w.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    (tmp_path / "notes.txt").write_text("hello")
    assert "a torch.save file" in rootguess.describe(Storage(str(tmp_path / "model.pt")))
    assert "a safetensors file" in rootguess.describe(Storage(str(tmp_path / "w.safetensors")))
    assert "is a file, not a checkpoint root" in rootguess.describe(
        Storage(str(tmp_path / "notes.txt"))
    )


def test_folders_point_at_the_root_to_give(tmp_path):
    run = tmp_path / "runs" / "wf"
    for part in ("pretrain/ckpt", "finetune/a/ckpt"):
        (run / part / "step-00000001").mkdir(parents=True)
        (run / part / "ckptflow-root.json").write_text("{}")
        (run / part / "step-00000001" / "COMMIT").write_text("{}")
    (tmp_path / "dcp").mkdir()
    (tmp_path / "dcp" / ".metadata").write_bytes(b"x")
    said = {
        p: rootguess.describe(Storage(str(p))) for p in (run / "pretrain", run, tmp_path / "runs")
    }
    assert f"its checkpoints are in {run}/pretrain/ckpt" in said[run / "pretrain"]
    assert said[run] == (
        f"{run} holds runs, not checkpoints; its checkpoint roots: "
        f"{run}/finetune/a/ckpt, {run}/pretrain/ckpt"
    )
    assert f"{run}/pretrain/ckpt" in said[tmp_path / "runs"]
    step = run / "pretrain" / "ckpt" / "step-00000001"
    assert f"one step of the checkpoint root {run}/pretrain/ckpt" in rootguess.describe(
        Storage(str(step))
    )
    assert "(DCP) folder" in rootguess.describe(Storage(str(tmp_path / "dcp")))
    # a root itself, an empty folder, or something unknown: no guess
    assert rootguess.describe(Storage(str(run / "pretrain" / "ckpt"))) is None
    (tmp_path / "empty").mkdir()
    assert rootguess.describe(Storage(str(tmp_path / "empty"))) is None

"""Retention that finds its roots (issue 33 point 7): `ckptflow ckpt roots` lists the checkpoint
roots the pipelines write under a storage root, and gc on a root that does not exist or holds
no checkpoint exits non-zero with one line instead of 'nothing was deleted'."""

from __future__ import annotations

import json

import torch
from ckptflow.steps.checkpoint import Checkpointer

from ckptflow.ckpt_cli import main
from ckptflow.core import rootreader
from ckptflow.core.storage import Storage


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def save(root: str, step: int = 1) -> None:
    Checkpointer(root).save(step, {"w": torch.full((4,), float(step))})


def test_gc_on_a_root_that_does_not_exist_fails_in_one_line(tmp_path, capsys):
    rc, out, err = run(capsys, "gc", str(tmp_path / "nope"), "--policy", "last=1")
    assert rc == 2 and "nothing was deleted" not in out
    assert "no checkpoints there" in err and len(err.strip().splitlines()) == 1


def test_gc_on_a_root_with_no_checkpoint_fails_in_one_line(tmp_path, capsys):
    root = tmp_path / "ckpt"
    rootreader.ensure_root(Storage(str(root)))  # a run that never saved a step
    rc, out, err = run(capsys, "gc", str(root), "--policy", "last=1")
    assert rc == 2 and "holds no checkpoint" in err and len(err.strip().splitlines()) == 1


def test_roots_lists_every_run_root_the_pipelines_write(tmp_path, capsys):
    runs = tmp_path / "runs"
    save(str(runs / "wf-a" / "pretrain" / "ckpt"))
    save(str(runs / "wf-a" / "finetune" / "lr0.01-freeze1" / "ckpt"))
    save(str(runs / "wf-b" / "pretrain" / "ckpt"), 3)
    rootreader.ensure_root(Storage(str(runs / "wf-c" / "pretrain" / "ckpt")))  # none saved yet
    (runs / "notes.txt").write_text("not a run")
    rc, out, err = run(capsys, "roots", str(runs), "--json")
    assert rc == 0, err
    assert json.loads(out) == [
        f"{runs}/wf-a/finetune/lr0.01-freeze1/ckpt",
        f"{runs}/wf-a/pretrain/ckpt",
        f"{runs}/wf-b/pretrain/ckpt",
    ]
    rc, out, _ = run(capsys, "roots", str(runs))
    assert rc == 0 and out.splitlines()[0] == f"{runs}/wf-a/finetune/lr0.01-freeze1/ckpt"


def test_roots_under_a_storage_root_with_none_fails_in_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for where in (tmp_path / "empty", tmp_path / "missing"):
        rc, out, err = run(capsys, "roots", str(where), "--json")
        assert rc == 2 and out == "" and "no checkpoint root" in err
        assert len(err.strip().splitlines()) == 1

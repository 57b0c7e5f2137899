"""Helpers of the peer tests: a real local piece (a Checkpointer save plus its PIECE file) under
a tmp_path sandbox, and two peer links on loopback."""

from __future__ import annotations

import shutil
from pathlib import Path

from ckptflow.core import layout, rootreader, tier
from ckptflow.core.storage import Storage

RUN_KEY = "0123456789abcdef"


def save_piece(
    root: Path, steps=(5,), size: int = 64 << 10, seed: int = 0
) -> dict[int, tier.Piece]:
    """Saves of a small state at `steps` into the rank root `root` (rank 0 of a world of 1),
    each with its PIECE (every object the step needs); the pieces by step."""
    import torch
    from ckptflow.steps.checkpoint.checkpointer import Checkpointer

    out = {}
    g = torch.Generator().manual_seed(seed)
    with Checkpointer(str(root), cooperative=False, compress=False) as ck:
        for step in steps:
            state = {
                "w": torch.rand(size // 4, generator=g),
                "b": torch.rand(16, generator=g),
                "step": torch.tensor(step),
            }
            ck.save(step, state)
    storage = Storage(str(root))
    for step in steps:
        m = rootreader.read_manifest(storage, step)
        save_id = rootreader.read_commit(storage, step)["save_id"]
        objects = {k: storage.size(layout.object_path(k)) for k in m["objects"]}
        piece = tier.new_piece(0, 1, step, layout.manifest_name(save_id), objects)
        tier.write_piece(storage, piece)
        out[step] = tier.read_piece(storage, step, 0)
    return out


def copy_root(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def rank_root(local_dir: Path, rank: int) -> Path:
    return Path(tier.piece_root(str(local_dir), RUN_KEY, rank))

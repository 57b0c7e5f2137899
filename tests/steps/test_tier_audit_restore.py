"""Audit of issue 35's restore (2 gloo ranks on simulated nodes, C's harness): a gang never
assembles a step from pieces of two different saves of that step number. After a restore that
fell back to an older step, the abandoned timeline's pieces can survive on a peer (a replica
the next push has not reached yet, a hostPath node that comes back); the new timeline saves the
same step numbers again. Loading rank 0 from one save and rank 1 from another would be a state
no save ever had, silently."""

from __future__ import annotations

import json
import os
import time

import torch
from ckptflow.steps.checkpoint import Checkpointer

from ckptflow.core import codec, layout, rootreader, tier
from ckptflow.core.storage import Storage
from tests.steps.test_tier_restore import Gang, _restored, built  # noqa: F401


def resave(root, step: int, rank: int) -> str:
    """Make rank `rank`'s piece of `step` under `root` another save of the same step (same
    root, a new save id and manifest, as a later timeline's save of that step number)."""
    old = tier.read_piece(root, step, rank)
    d = layout.step_dir(step)
    m = json.loads(root.read(f"{d}/{old.manifest}"))
    m["created_at"] = time.time() + 1  # another save: its own manifest (same tensors here)
    blob = json.dumps(m).encode()
    commit = rootreader.read_commit(root, step)
    save_id = "fedcba9876543210"
    root.write(f"{d}/{layout.manifest_name(save_id)}", blob)
    os.remove(root.path(f"{d}/{old.manifest}"))
    doc = json.loads(root.read(layout.commit_path(step)))
    doc.update(save_id=save_id, manifest_xxh3=codec.digest(blob))
    assert commit["save_id"] != save_id
    root.write(layout.commit_path(step), json.dumps(doc).encode())
    piece = tier.new_piece(rank, old.world_size, step, layout.manifest_name(save_id), old.objects)
    tier.write_piece(root, piece)
    assert tier.verify_piece(root, piece) is None  # each piece is sound on its own
    return save_id


def test_pieces_of_two_saves_of_one_step_are_never_loaded_together(built, tmp_path):  # noqa: F811
    g = Gang(built, tmp_path)
    resave(g.root(1, 1), 4, 1)  # rank 1's own copy of step 4 and its replica on node 0
    resave(g.root(0, 1), 4, 1)  # are of another save than rank 0's pieces of step 4
    docs = g.restore()
    _restored(docs, 3, "local")  # the newest step of ONE save every rank has: 3


def test_a_rank_folder_planted_as_a_link_is_neither_read_nor_fetched_into(tmp_path):
    from ckptflow.steps.checkpoint.tier import restore as rs

    from tests.steps.tier_restore_workers import copy_piece

    scratch = Checkpointer(str(tmp_path / "scratch"), manifests="step")  # as the local tier
    scratch.save(4, {"w": torch.arange(10.0)})
    scratch.close()
    other = tier.piece_root(str(tmp_path / "local"), tier.run_key("s3://b/another"), 0)
    copy_piece(scratch.root, 4, 0, 1, other)  # another run's complete piece of step 4
    key = tier.run_key("s3://b/run")
    os.makedirs(tmp_path / "local" / key)
    os.symlink(other, tmp_path / "local" / key / "rank-0")
    manifest = tier.read_piece(Storage(other), 4, 0).manifest
    fetched = []
    src = rs.TierSource(str(tmp_path / "local"), key, None, lambda *a: fetched.append(a))
    skipped: list[str] = []
    assert rs._own_piece(src, 0, (4, manifest), [1], skipped) is None
    assert fetched == [] and any("symbolic link" in s for s in skipped)

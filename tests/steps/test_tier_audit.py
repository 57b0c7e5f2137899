"""Audit of issue 35 (the local tier) against hostile local volumes: the tier only ever
writes and deletes inside <local_dir>/<run_key>/, never through a link planted there, never
in another run's folder nor in the user's own files beside it."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.checkpoint.tier import local_retention
from ckptflow.steps.checkpoint.tier.local_save import LocalTier
from ckptflow.steps.checkpoint.tier.peers import PeerError, PeerLink

from ckptflow.core import layout, tier

KEY = tier.run_key("s3://bucket/run/audit")
OTHER = tier.run_key("s3://bucket/another-run")


def state(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(4096, generator=g), "sched": {"step": step}}


def snapshot(folder) -> dict[str, bytes]:
    """Every file under `folder` (links not followed) and its bytes."""
    out = {}
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = f.read()
    return out


def a_users_checkpoint_root(path) -> dict[str, bytes]:
    """A real ckptflow root of the user's (steps 1..3), the files' bytes."""
    ck = Checkpointer(str(path), compress=False)
    for step in (1, 2, 3):
        ck.save(step, state(step))
    ck.close()
    return snapshot(path)


def test_a_rank_folder_planted_as_a_link_is_never_written_nor_deleted_through(tmp_path, caplog):
    user = tmp_path / "users-ckpt"
    before = a_users_checkpoint_root(user)
    local_dir = tmp_path / "local"
    (local_dir / KEY).mkdir(parents=True)
    os.symlink(user, local_dir / KEY / "rank-0")  # planted in a shared hostPath
    caplog.set_level(logging.WARNING)
    lt = LocalTier(str(local_dir), KEY, 0, 1, keep=1, compress=False)
    for step in (5, 6):
        lt.save(step, state(step))
    lt.settle()
    lt.forget_after(0)
    lt.close()
    assert snapshot(user) == before  # nothing written, nothing deleted there
    assert not lt.enabled
    assert any("rank-0" in r.getMessage() for r in caplog.records)


def test_a_run_folder_planted_as_a_link_is_never_written_nor_deleted_through(tmp_path):
    other = tmp_path / "local" / OTHER
    a_users_checkpoint_root(other / "rank-0")
    before = snapshot(other)
    os.symlink(other, tmp_path / "local" / KEY)  # this run's folder is another run's
    lt = LocalTier(str(tmp_path / "local"), KEY, 0, 1, keep=1, compress=False)
    for step in (5, 6):
        lt.save(step, state(step))
    lt.settle()
    lt.forget_after(0)
    lt.close()
    assert snapshot(other) == before
    assert not lt.enabled


def test_another_runs_folder_and_the_users_files_beside_the_run_are_untouched(tmp_path):
    local_dir = tmp_path / "home"  # a user folder given as local_dir
    (local_dir / layout.step_dir(1)).mkdir(parents=True)
    (local_dir / "notes.txt").write_text("mine")
    (local_dir / layout.step_dir(1) / "COMMIT").write_text("mine too")
    a_users_checkpoint_root(local_dir / OTHER / "rank-0")
    before = snapshot(local_dir)
    lt = LocalTier(str(local_dir), KEY, 0, 1, keep=1, size_mib=0, compress=False)
    for step in (1, 2, 3):
        lt.save(step, state(step))
    lt.settle()
    lt.forget_after(1)
    lt._turn_off("audit")  # the deletes of a volume too small
    lt.close()
    after = snapshot(local_dir)
    assert {k: v for k, v in after.items() if not k.startswith(KEY)} == before
    assert any(k.startswith(OTHER) for k in after)  # (the comparison above covers it)


def test_a_peer_server_never_serves_from_nor_writes_into_a_linked_run_folder(tmp_path):
    other = tmp_path / "local" / OTHER
    a_users_checkpoint_root(other / "rank-1")  # another run's replica folder of rank 1
    os.symlink(other, tmp_path / "local" / KEY)
    with pytest.raises(PeerError, match="symbolic link"):
        PeerLink(str(tmp_path / "local"), KEY, 0, host="127.0.0.1")


def test_a_local_dir_that_is_a_file_turns_the_tier_off_and_forget_after_does_not_raise(tmp_path):
    (tmp_path / "f.txt").write_text("a user's file")
    lt = LocalTier(str(tmp_path / "f.txt"), KEY, 0, 1, keep=1, compress=False)
    assert not lt.enabled
    assert lt.forget_after(0) == []  # pretrain calls it after every resume
    assert lt.save(2, state(2)) is None
    lt.close()
    assert (tmp_path / "f.txt").read_text() == "a user's file"


def test_a_local_dir_not_on_local_disk_makes_no_folder_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for uri in ("s3://bucket/x", "memory://x"):
        lt = LocalTier(uri, KEY, 0, 1, keep=1, compress=False)
        assert not lt.enabled  # a node-local volume is a local folder
        lt.close()
    assert os.listdir(tmp_path) == []


def test_a_link_planted_after_the_tier_started_takes_no_delete_through_it(tmp_path):
    user = tmp_path / "users-ckpt"
    before = a_users_checkpoint_root(user)
    lt = LocalTier(str(tmp_path / "local"), KEY, 0, 1, keep=1, compress=False)
    for step in (1, 2):
        lt.save(step, state(step))
    lt.settle()
    real = tmp_path / "local" / KEY / "rank-0"
    os.rename(real, tmp_path / "moved")
    os.symlink(user, real)  # swapped in while the run trains
    local_retention.retain(lt.storage, 0, keep=1)
    lt.forget_after(0)
    lt._turn_off("audit")
    lt.close()
    assert snapshot(user) == before

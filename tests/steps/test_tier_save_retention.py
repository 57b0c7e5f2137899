"""The local tier in one process (steps/checkpoint/tier/local_save.py, local_retention.py, issue
35): the Checkpointer's on_commit hook, pieces, retention by count and by size, a volume too
small for one step, a full disk, a failed fan-out."""

from __future__ import annotations

import logging

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.checkpoint.tier import fanout, local_retention
from ckptflow.steps.checkpoint.tier.local_save import LocalTier, compress_like

from ckptflow.core import layout, tier
from ckptflow.core.storage_errors import StorageError

KEY = tier.run_key("s3://bucket/run/ckpt")
MIB = 1 << 20


def state(step: int, mib: int = 1) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(mib * MIB // 4, generator=g), "sched": {"step": step}}


def local(tmp_path, **kw) -> LocalTier:
    kw.setdefault("compress", False)  # sizes as the tensors' (the budget tests count them)
    return LocalTier(str(tmp_path / "local"), KEY, 0, 1, **kw)


def steps_of(lt: LocalTier) -> list[int]:
    return sorted(local_retention.complete_steps(lt.storage, 0))


def objects_of(lt: LocalTier) -> list[str]:
    return [e.path for e in lt.storage.walk(layout.OBJECTS)]


def test_on_commit_runs_after_the_commit_and_its_failure_is_the_saves(tmp_path):
    seen = []

    def hook(job, sd, group):
        seen.append((job.step, ck.storage.exists(layout.commit_path(job.step)), sorted(sd)))
        if job.step == 2:
            raise RuntimeError("hook failed")

    ck = Checkpointer(str(tmp_path / "ck"), on_commit=hook)
    ck.save(1, state(1))
    assert seen == [(1, True, ["sched", "w"])]
    handle = ck.save(2, state(2), block=False)
    with pytest.raises(RuntimeError, match="hook failed"):
        handle.wait()
    assert seen[-1][:2] == (2, True)
    with pytest.raises(RuntimeError, match="hook failed"):  # raised where saves raise theirs
        ck.close()


def test_a_local_save_writes_a_complete_piece_that_loads(tmp_path):
    lt = local(tmp_path)
    handle = lt.save(3, state(3))
    handle.wait()
    piece = tier.read_piece(lt.storage, 3, 0)
    assert tier.verify_piece(lt.storage, piece) is None
    assert piece.world_size == 1 and piece.bytes >= MIB
    assert [p.step for p in tier.list_pieces(str(tmp_path / "local"), KEY)] == [3]
    lt.close()
    got = {"w": torch.zeros(MIB // 4), "sched": {"step": 0}}
    Checkpointer(lt.root, cooperative=False).load(got, step=3)
    assert torch.equal(got["w"], state(3)["w"]) and got["sched"] == {"step": 3}


def test_retention_keeps_the_last_local_keep_steps_and_their_objects_only(tmp_path):
    lt = local(tmp_path, keep=2)
    for step in (1, 2, 3, 4):
        lt.save(step, state(step))
    lt.close()
    assert steps_of(lt) == [3, 4]
    assert sorted(
        layout.parse_step_dir(n) for n in lt.storage.listdir() if n.startswith("step-")
    ) == [3, 4]
    named = set()
    for s in (3, 4):
        named |= set(tier.read_piece(lt.storage, s, 0).objects)
    assert {p.rsplit("/", 1)[1] for p in objects_of(lt)} == named


def test_the_size_budget_keeps_fewer_steps_and_room_for_the_next_save(tmp_path):
    lt = local(tmp_path, keep=3, size_mib=4)  # a step is ~1 MiB: 3 fit, 2 kept + the next
    for step in (1, 2, 3, 4):
        lt.save(step, state(step))
    lt.close()
    assert lt.enabled and steps_of(lt) == [3, 4]
    lt = local(tmp_path / "b", keep=3, size_mib=6, copies=2)  # replicas share the volume
    kept = []
    lt.on_keep = kept.append  # what the peers' replica retention is told
    for step in (1, 2, 3):
        lt.save(step, state(step))
    lt.close()
    assert lt.enabled and steps_of(lt) == [3] and kept == [1, 1, 1]


def test_free_space_is_the_budget_without_local_size_mib(tmp_path, monkeypatch):
    lt = local(tmp_path, keep=3)
    cap = 7 * MIB // 2  # a volume of 3.5 MiB that this rank's steps alone fill

    def usage(path):
        free = max(cap - local_retention.used_bytes(lt.root), 0)
        return local_retention.shutil._ntuple_diskusage(cap, cap - free, free)

    monkeypatch.setattr(local_retention.shutil, "disk_usage", usage)
    for step in (1, 2, 3, 4):  # what the root holds + the free space: 3 steps, 2 kept
        lt.save(step, state(step))
    lt.close()
    assert lt.enabled and steps_of(lt) == [3, 4]


@pytest.mark.parametrize("mib", [1, 2])  # none fits; one fits, not the next one beside it
def test_a_volume_too_small_for_one_step_turns_the_tier_off_with_one_warning(tmp_path, caplog, mib):
    lt = local(tmp_path, keep=2, size_mib=mib)  # a step is over 1 MiB
    with caplog.at_level(logging.WARNING, logger="ckptflow.tier"):
        first = lt.save(1, state(1))
        first.wait()  # the save itself ends well: the decision comes after it
        assert lt.save(2, state(2)) is None
        assert lt.save(3, state(3)) is None
    lt.close()
    off = [r for r in caplog.records if "local tier off" in r.getMessage()]
    assert len(off) == 1 and "cannot hold one step" in off[0].getMessage()
    assert not lt.enabled and steps_of(lt) == [] and objects_of(lt) == []


def test_a_full_disk_turns_the_tier_off_and_training_goes_on(tmp_path, caplog):
    lt = local(tmp_path)
    lt.save(1, state(1))
    real = lt.storage.write

    def full(rel, data, **kw):
        if rel.startswith(layout.OBJECTS):
            raise StorageError(f"{rel}: no space left on device", "disk-full")
        return real(rel, data, **kw)

    lt.storage.write = full
    with caplog.at_level(logging.WARNING, logger="ckptflow.tier"):
        lt.save(2, state(2))  # fails in the background
        assert lt.save(3, state(3)) is None  # the failure seen: off, never raised
    lt.close()
    assert not lt.enabled
    assert sum("local tier off" in r.getMessage() for r in caplog.records) == 1


def test_a_failed_local_save_is_a_warning_and_the_next_step_tries_again(
    tmp_path, caplog, monkeypatch
):
    lt = local(tmp_path, keep=3)
    real = tier.write_piece
    monkeypatch.setattr(
        tier,
        "write_piece",
        lambda st, p: (_ for _ in ()).throw(OSError("io")) if p.step == 2 else real(st, p),
    )
    with caplog.at_level(logging.WARNING, logger="ckptflow.tier"):
        for step in (1, 2, 3):
            lt.save(step, state(step))
        lt.close()
    assert lt.enabled and steps_of(lt) == [1, 3]
    assert any("local save of step 2 failed" in r.getMessage() for r in caplog.records)


def test_retention_never_deletes_the_newest_complete_step_nor_a_busy_one(tmp_path):
    lt = local(tmp_path, keep=3)
    for step in (1, 2, 3):
        lt.save(step, state(step))
    lt.close()
    lt.storage.delete([tier.piece_path(3, 0)])  # step 3 incomplete: 2 is the newest complete
    assert local_retention.retain(lt.storage, 0, keep=1) == [1]
    assert steps_of(lt) == [2]
    assert layout.step_dir(3) in lt.storage.listdir()  # newer than the newest complete: stays
    lt2 = local(tmp_path / "b", keep=3)
    for step in (1, 2, 3):
        lt2.save(step, state(step))
    lt2.close()
    assert local_retention.retain(lt2.storage, 0, keep=1, busy={1}) == [2]
    assert steps_of(lt2) == [1, 3]
    # a kept step's objects all stay (it still verifies, hashes included)
    for s in (1, 3):
        assert tier.verify_piece(lt2.storage, tier.read_piece(lt2.storage, s, 0)) is None


def test_fit_and_step_bytes(tmp_path):
    assert local_retention.fit(10, 5) == 2 and local_retention.fit(10, 5, copies=2) == 1
    assert local_retention.fit(4, 5) == 0 and local_retention.fit(-1, 5) == 0
    lt = local(tmp_path)
    lt.save(1, state(1)).wait()
    piece = tier.read_piece(lt.storage, 1, 0)
    assert fanout.step_bytes(piece, lt.storage) > piece.bytes
    lt.close()


def test_local_saves_compress_as_the_durable_root_resolves(tmp_path):
    assert compress_like(Checkpointer(str(tmp_path / "a"), compress=False)) is False
    assert compress_like(Checkpointer(str(tmp_path / "b"), compress=True)) is True
    assert compress_like(Checkpointer(str(tmp_path / "c"))) == "auto"  # local disk: adaptive
    assert compress_like(Checkpointer("memory://tier-ck/x")) == "auto"


def test_steps_above_the_resumed_one_are_forgotten_with_their_objects(tmp_path):
    lt = local(tmp_path, keep=5)
    for step in (2, 4, 6):
        lt.save(step, state(step))
    lt.settle()
    assert lt.forget_after(2) == [4, 6]
    assert steps_of(lt) == [2]
    assert {p.rsplit("/", 1)[1] for p in objects_of(lt)} == set(
        tier.read_piece(lt.storage, 2, 0).objects
    )
    lt.save(4, state(40)).wait()  # the same step number again: a new save, not refused
    assert steps_of(lt) == [2, 4]
    lt.close()


def test_a_local_dir_that_cannot_be_written_turns_the_tier_off_at_start(tmp_path, caplog):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the local volume should be")
    with caplog.at_level(logging.WARNING, logger="ckptflow.tier"):
        lt = LocalTier(str(blocker), KEY, 0, 1)
        assert lt.save(1, state(1)) is None
    lt.close()
    off = [r.getMessage() for r in caplog.records if "local tier off" in r.getMessage()]
    assert len(off) == 1 and "is not writable" in off[0]
    assert blocker.read_text().startswith("a file")


def test_start_tier_hands_each_piece_and_the_keep_to_the_peers(tmp_path):
    from types import SimpleNamespace

    from ckptflow.steps.checkpoint.tier.setup import TierSettings, start_tier

    pushed = []
    side = SimpleNamespace(replicate=lambda step, p: pushed.append((step, p.rank)))
    side.link = SimpleNamespace(keep=9)
    ck = Checkpointer(str(tmp_path / "ckpt"))
    settings = TierSettings(local_every=2, local_dir=str(tmp_path / "local"), replicas=1)
    parts = start_tier(ck, settings, side)
    assert parts.due(4) and not parts.due(3)
    assert parts.local.root == tier.piece_root(str(tmp_path / "local"), tier.run_key(ck.root), 0)
    assert parts.local.copies == 2  # its pieces and the replicas it holds for a peer
    parts.local.save(2, state(2))
    parts.close()
    assert pushed == [(2, 0)] and side.link.keep == 2
    assert start_tier(ck, TierSettings(local_every=0)) is None

"""The drain on two gloo ranks (steps/checkpoint/tier/drain.py): each rank uploads from its own
piece, the shared items' objects go up once, a drained step loads with a fresh Checkpointer on
the durable root (local disk and S3) and holds the local bytes, a later drain uploads only what
the durable root lacks, and a damaged object on one rank fails the drain on both."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from ckptflow.core import codec, layout
from ckptflow.core.storage import Storage
from tests.steps import ckpt_helpers as h
from tests.steps import distworkers as dw
from tests.steps import tier_drain_helpers as th


def _gather(obj, world: int) -> list:
    out: list = [None] * world
    dist.all_gather_object(out, obj)
    return out


def _load_equals(durable: str, step: int, state: dict) -> None:
    from ckptflow.steps.checkpoint import Checkpointer

    target = h.zeros_like_state(state)
    assert Checkpointer(durable).load(target, step=step) == step
    h.assert_same(state, target)


def _drain_worker(rank: int, world: int, local_dir: str, durable: str, out: str) -> None:
    from ckptflow.steps.checkpoint import Checkpointer
    from ckptflow.steps.checkpoint.tier.drain import drain

    local = th.local_checkpointer(local_dir, durable, rank)
    state5 = th.rank_state(rank, 5)
    piece5 = th.save_piece(local, 5, state5)
    ck = Checkpointer(durable, storage=th.CountingStorage(durable))
    stats5 = drain(ck, local.storage, 5).wait()
    written5, ck.storage.written = ck.storage.written, []
    _load_equals(durable, 5, state5)  # every rank loads its own items
    st = Storage(durable)
    same = all(
        st.read(layout.object_path(k)) == local.storage.read(layout.object_path(k))
        for k in piece5.objects
    )
    state6 = th.rank_state(rank, 6, changed=rank == 1)  # rank 1's `b` and the step changed
    piece6 = th.save_piece(local, 6, state6)
    stats6 = drain(ck, local.storage, 6).wait()
    _load_equals(durable, 6, state6)
    ck.close()
    row = {
        "written5": written5,
        "written6": ck.storage.written,
        "piece5": piece5.objects,
        "piece6": piece6.objects,
        "same": same,
        "stats5": stats5.as_dict(),
        "stats6": stats6.as_dict(),
        "manifest5": Checkpointer(durable).manifest(5)["objects"],
    }
    rows = _gather(row, world)
    if rank == 0:
        torch.save(rows, out)


@pytest.mark.parametrize("where", ["file", pytest.param("s3", marks=pytest.mark.s3)])
def test_two_ranks_drain_their_pieces_once_each(tmp_path, where, request):
    if where == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        durable = f"s3://{bucket}/run/ckpt"
    else:
        durable = str(tmp_path / "durable")
    out = str(tmp_path / "rows.pt")
    dw.spawn(2, _drain_worker, str(tmp_path / "local"), durable, out)
    rows = torch.load(out, weights_only=False)
    assert all(r["same"] for r in rows), "the durable objects are the local bytes"
    # every object of the step went up, each once: shared ones by one rank only
    w0, w1 = (set(r["written5"]) for r in rows)
    assert len(rows[0]["written5"]) == len(w0) and not w0 & w1
    assert w0 | w1 == set(rows[0]["manifest5"])
    shared = set(rows[0]["piece5"]) & set(rows[1]["piece5"])
    assert shared and shared <= w0  # the lowest rank listing an object uploads it
    # step 6: only what the durable root lacked (rank 1's `b`, the step value's pack)
    new = (set(rows[0]["piece6"]) | set(rows[1]["piece6"])) - set(rows[0]["manifest5"])
    assert new and set(rows[0]["written6"]) | set(rows[1]["written6"]) == new
    assert set(rows[1]["written6"]) - shared, "rank 1 uploaded its own changed tensor"
    for r in rows:
        assert r["stats5"]["kind"] == "drain" and r["stats5"]["bytes_reused"] == 0
        assert (
            r["stats6"]["bytes_written"] + r["stats6"]["bytes_reused"] == r["stats6"]["bytes_raw"]
        )


def _damaged_worker(rank: int, world: int, local_dir: str, durable: str, out: str) -> None:
    from ckptflow.steps.checkpoint import Checkpointer
    from ckptflow.steps.checkpoint.tier.drain import DrainError, drain

    local = th.local_checkpointer(local_dir, durable, rank)
    state = th.rank_state(rank, 5)
    piece = th.save_piece(local, 5, state)
    key = ""
    if rank == 1:  # its own big tensor's object: damaged on this rank's disk, same size
        key = max(piece.objects, key=piece.objects.get)
        path = local.storage.path(layout.object_path(key))
        with open(path, "r+b") as f:
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 1]))
    key = _gather(key, world)[1]
    ck = Checkpointer(durable)
    try:
        drain(ck, local.storage, 5).wait()
        error = None
    except DrainError as exc:
        error = str(exc)
    committed = Storage(durable).exists(layout.commit_path(5))
    # the fallback contract: the caller saves the step the normal way; it loads
    ck.save(5, state)
    _load_equals(durable, 5, state)
    ck.close()
    rows = _gather({"error": error, "committed": committed, "key": key}, world)
    if rank == 0:
        torch.save(rows, out)


def test_a_damaged_object_on_one_rank_fails_the_drain_on_every_rank(tmp_path):
    out = str(tmp_path / "rows.pt")
    durable = str(tmp_path / "durable")
    dw.spawn(2, _damaged_worker, str(tmp_path / "local"), durable, out)
    rows = torch.load(out, weights_only=False)
    key = rows[0]["key"]
    for r in rows:
        assert r["error"] is not None and not r["committed"]
        assert "upload failed (rank 1)" in r["error"] and key in r["error"]
        assert "damaged" in r["error"] and "save step 5, or the next one" in r["error"]
    # the damaged bytes never went up (the fallback save may have stored the sound ones)
    st = Storage(durable)
    rel = layout.object_path(key)
    assert not st.exists(rel) or codec.digest(st.read(rel)) == key


def _local_tier_worker(rank: int, world: int, local_dir: str, durable: str, out: str) -> None:
    """The tiny FSDP2 GPT's training state saved by the local tier (LocalTier: its save,
    fan-out and PIECE), drained into the durable root, loaded back by a fresh Checkpointer."""
    from ckptflow.steps.checkpoint import Checkpointer
    from ckptflow.steps.checkpoint.tier.drain import drain
    from ckptflow.steps.checkpoint.tier.local_save import LocalTier, compress_like
    from ckptflow.steps.lib.state import apply_train_state, rng_entry, train_state

    from ckptflow.core import tier
    from tests.steps import tier_save_workers as tsw

    dinfo, objs = tsw.setup(rank, world)
    ck = Checkpointer(durable)
    lt = LocalTier(local_dir, tier.run_key(durable), rank, world, compress=compress_like(ck))
    tsw.train(objs, dinfo, 2)
    state = train_state(*objs, 2)
    state.update(rng_entry(rank, dinfo.device))
    handle = lt.save(2, state, metadata={"data": objs[3].state_dict()})
    saved = tsw.flat(state)
    stats = drain(ck, lt.storage, 2, local_save=handle).wait()
    lt.close()
    ck.close()
    st = Storage(durable)
    m = Checkpointer(durable).manifest(2)
    piece = tier.read_piece(lt.storage, 2, rank)
    same_bytes = all(
        st.read(layout.object_path(k)) == lt.storage.read(layout.object_path(k))
        for k in piece.objects
    )
    _, fresh = tsw.setup(rank, world, seed=7)
    tsw.train(fresh, dinfo, 1)
    got = train_state(*fresh, 0)
    got.update(rng_entry(rank, dinfo.device))
    loaded = Checkpointer(durable).load(got, step=2)
    step = apply_train_state(got, *fresh)
    row = {
        "loaded": loaded,
        "step": step,
        "diff": tsw.same(saved, tsw.flat(got)),
        "same_bytes": same_bytes,
        "piece": sorted(piece.objects),
        "manifest": sorted(m["objects"]),
        "written": stats.bytes_written,
        "stored": m["stats"]["stored_bytes"],
        "metadata": m["metadata"],
    }
    rows = _gather(row, world)
    if rank == 0:
        torch.save(rows, out)


def test_a_local_tier_save_drains_and_loads_from_the_durable_root(tmp_path):
    """With the local tier's own save (core/tier.py layout, fan-out, PIECE): the drained step
    is the saved training state, loaded by a fresh Checkpointer on the durable root."""
    out = str(tmp_path / "rows.pt")
    dw.spawn(2, _local_tier_worker, str(tmp_path / "local"), str(tmp_path / "durable"), out)
    rows = torch.load(out, weights_only=False)
    for r in rows:
        assert (r["loaded"], r["step"], r["diff"]) == (2, 2, [])
        assert r["same_bytes"] and set(r["piece"]) <= set(r["manifest"])
        assert "data" in r["metadata"]
    assert set(rows[0]["piece"]) | set(rows[1]["piece"]) == set(rows[0]["manifest"])
    assert rows[0]["written"] + rows[1]["written"] == rows[0]["stored"]  # each object once

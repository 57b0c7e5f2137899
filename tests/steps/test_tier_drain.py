"""The drain of a local step into the durable root (steps/checkpoint/tier/drain.py), one process:
the drained step loads with the normal reader, its objects are the local bytes, objects the
durable root has are not uploaded again, and every failure commits nothing and says why."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.checkpoint.tier.drain import KIND, DrainError, drain

from ckptflow.core import codec, intent, layout, rootreader, tier
from ckptflow.core.gc import gc
from ckptflow.core.storage import Storage
from tests.steps import ckpt_helpers as h
from tests.steps import tier_drain_helpers as th


def _local(tmp_path, durable: str, step: int, state: dict):
    ck = th.local_checkpointer(str(tmp_path / "local"), durable, 0)
    return ck, th.save_piece(ck, step, state)


def _durable(uri: str, cls=th.CountingStorage) -> Checkpointer:
    return Checkpointer(uri, storage=cls(uri))


def test_a_drained_step_loads_and_holds_the_local_bytes(tmp_path):
    durable = str(tmp_path / "durable")
    state = th.rank_state(0, 5)
    local, piece = _local(tmp_path, durable, 5, state)
    ck = _durable(durable)
    stats = drain(ck, local.storage, 5).wait()
    assert stats.kind == KIND and stats.step == 5
    assert stats.bytes_written == piece.bytes == stats.bytes_raw and stats.bytes_reused == 0
    assert ck.storage.sized == len(piece.objects)  # each rank's own-object check at the commit
    target = h.zeros_like_state(state)
    assert Checkpointer(durable).load(target, step=5) == 5
    h.assert_same(state, target)
    m = Checkpointer(durable).manifest(5)
    assert set(m["objects"]) == set(piece.objects)
    st = Storage(durable)
    for key in m["objects"]:
        rel = layout.object_path(key)
        assert st.read(rel) == local.storage.read(rel)
    assert m["root_id"] == rootreader.read_root_id(st) != rootreader.read_root_id(local.storage)
    assert Checkpointer(durable).verify(5)["objects"] == len(piece.objects)
    # the loop's lineage reads these (steps/lib/loop.py _log_committed)
    assert rootreader.read_commit(st, 5)["manifest_xxh3"]
    assert m["stats"]["new_bytes"] == piece.bytes


def test_objects_the_durable_root_holds_are_not_uploaded_again(tmp_path):
    durable = str(tmp_path / "durable")
    local, _ = _local(tmp_path, durable, 5, th.rank_state(0, 5))
    ck = _durable(durable)
    drain(ck, local.storage, 5).wait()
    ck.storage.written.clear()
    state6 = th.rank_state(0, 6, changed=True)  # `b` and the step changed, the rest not
    piece6 = th.save_piece(local, 6, state6)
    stats = drain(ck, local.storage, 6).wait()
    new = set(piece6.objects) - set(Checkpointer(durable).manifest(5)["objects"])
    assert new and sorted(ck.storage.written) == sorted(new)
    assert stats.bytes_written == sum(piece6.objects[k] for k in new)
    assert stats.bytes_reused == piece6.bytes - stats.bytes_written > 0
    target = h.zeros_like_state(state6)
    Checkpointer(durable).load(target, step=6)
    h.assert_same(state6, target)


def test_a_later_direct_save_deduplicates_against_the_drained_step(tmp_path):
    """The fallback (or last) durable save after a drain stores only what changed: the
    Checkpointer adopts the drained step's parts as it would its own save's."""
    durable = str(tmp_path / "durable")
    local, piece = _local(tmp_path, durable, 5, th.rank_state(0, 5))
    ck = _durable(durable)
    drain(ck, local.storage, 5).wait()
    ck.storage.written.clear()
    state6 = th.rank_state(0, 6, changed=True)
    stats = ck.save(6, state6)
    unchanged = state6["r0.w"].nbytes + state6["r0.big"].nbytes + state6["shared.lr"].nbytes
    assert stats.stats.bytes_reused == unchanged
    assert not set(ck.storage.written) & set(piece.objects)
    target = h.zeros_like_state(state6)
    Checkpointer(durable).load(target, step=6)
    h.assert_same(state6, target)


def test_a_damaged_object_in_the_durable_root_is_uploaded_again(tmp_path):
    """Bytes the durable root holds under a key are referenced only once read and found to be
    what the key says (as the writer reuses objects, reuse.py): a damaged one is rewritten."""
    durable = str(tmp_path / "durable")
    local, piece = _local(tmp_path, durable, 5, th.rank_state(0, 5))
    ck = _durable(durable)
    drain(ck, local.storage, 5).wait()
    key = max(piece.objects, key=piece.objects.get)
    _flip(Storage(durable), key)
    th.save_piece(local, 6, th.rank_state(0, 6))
    drain(ck, local.storage, 6).wait()
    assert key in ck.storage.written
    Checkpointer(durable).verify(6)


def _flip(st: Storage, key: str) -> None:
    path = st.path(layout.object_path(key))
    with open(path, "r+b") as f:
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0xFF]))


def _intents(st: Storage, step: int) -> list[dict]:
    names = st.listdir(layout.step_dir(step)) if st.exists(layout.step_dir(step)) else []
    return [
        json.loads(st.read(f"{layout.step_dir(step)}/{n}"))
        for n in names
        if n.startswith("saving-")
    ]


def test_a_damaged_local_object_fails_the_drain_and_commits_nothing(tmp_path):
    durable = str(tmp_path / "durable")
    local, piece = _local(tmp_path, durable, 5, th.rank_state(0, 5))
    key = max(piece.objects, key=piece.objects.get)
    _flip(local.storage, key)
    handle = drain(_durable(durable), local.storage, 5)
    with pytest.raises(DrainError, match=f"{key}.*damaged.*save step 5, or the next one"):
        handle.wait()
    st = Storage(durable)
    assert not st.exists(layout.commit_path(5))
    assert not st.exists(layout.object_path(key))
    assert [i.get("ended_at") is not None for i in _intents(st, 5)] == [True]
    assert not intent.live_starts(st, 5, now=1e10)


def test_an_unreachable_store_fails_the_drain_and_a_normal_save_follows(tmp_path):
    durable = str(tmp_path / "durable")
    state = th.rank_state(0, 5)
    local, _ = _local(tmp_path, durable, 5, state)
    ck = _durable(durable, th.DownStorage)
    with pytest.raises(DrainError, match="upload failed.*unreachable"):
        drain(ck, local.storage, 5).wait()
    assert not ck.storage.exists(layout.commit_path(5))
    # the fallback contract: the caller saves the step the normal way, once the store is back
    fresh = Checkpointer(durable)
    fresh.save(5, state)
    target = h.zeros_like_state(state)
    Checkpointer(durable).load(target, step=5)
    h.assert_same(state, target)


def test_a_step_the_durable_root_has_committed_is_left_alone(tmp_path):
    durable = str(tmp_path / "durable")
    state = th.rank_state(0, 5)
    local, _ = _local(tmp_path, durable, 5, state)
    Checkpointer(durable).save(5, state)
    before = rootreader.read_commit(Storage(durable), 5)
    ck = _durable(durable)
    stats = drain(ck, local.storage, 5).wait()
    assert ck.storage.written == [] and stats.bytes_written == 0
    assert rootreader.read_commit(Storage(durable), 5) == before


class _Failed:
    def wait(self):
        raise OSError("No space left on device")


def test_a_failed_local_save_or_a_missing_piece_fails_the_drain(tmp_path):
    durable = str(tmp_path / "durable")
    local, _ = _local(tmp_path, durable, 5, th.rank_state(0, 5))
    with pytest.raises(DrainError, match="local save did not complete.*No space left"):
        drain(_durable(durable), local.storage, 5, local_save=_Failed()).wait()
    local.storage.delete([tier.piece_path(5, 0)])
    with pytest.raises(DrainError, match="PIECE-0.json is missing"):
        drain(_durable(durable), local.storage, 5).wait()
    assert not Storage(durable).exists(layout.commit_path(5))


def test_a_later_save_waits_for_the_drain_and_is_not_failed_by_it(tmp_path):
    """The drain is the durable Checkpointer's save in flight: its next save starts after it
    and does not raise its failure (the drain's own handle does)."""
    durable = str(tmp_path / "durable")
    state = th.rank_state(0, 5)
    local, piece = _local(tmp_path, durable, 5, state)
    _flip(local.storage, next(iter(piece.objects)))
    ck = _durable(durable)
    handle = drain(ck, local.storage, 5)
    ck.save(6, th.rank_state(0, 6), block=False).wait()  # the fallback: the next step
    assert handle.done()
    with pytest.raises(DrainError):
        handle.wait()
    assert Checkpointer(durable).committed_steps() == [6]
    ck.close()


@pytest.mark.s3
def test_a_drain_into_s3_loads_from_there(tmp_path, s3_bucket):
    durable = f"s3://{s3_bucket}/run/ckpt"
    state = th.rank_state(0, 5)
    local, piece = _local(tmp_path, durable, 5, state)
    stats = drain(Checkpointer(durable), local.storage, 5).wait()
    assert stats.bytes_written == piece.bytes
    target = h.zeros_like_state(state)
    assert Checkpointer(durable).load(target) == 5
    h.assert_same(state, target)
    assert isinstance(target["shared.lr"], torch.Tensor)


class _Lineage:
    """What the loop's lineage path calls (steps/lib/loop.py _reap/_log_committed), recorded."""

    run_id = "run-1"

    def __init__(self):
        self.checkpoints, self.metrics, self.failed = [], [], []

    def log_checkpoint(self, step, uri, digest, sizes, model_id=None):
        self.checkpoints.append((step, uri, digest, sizes, model_id))

    def log_metrics(self, metrics, step):
        self.metrics.append((metrics, step))

    def fail_checkpoint(self, model_id, why):
        self.failed.append((model_id, why))


def test_the_loop_logs_a_drained_step_as_a_committed_checkpoint(tmp_path):
    """A drain's handle goes where a durable save's does (the loop's pending saves): reaped,
    its step logged as a committed checkpoint with the durable manifest's digest and sizes."""
    from ckptflow.steps.lib.distributed import DistInfo
    from ckptflow.steps.lib.loop import CheckpointedLoop, LoopSpec, TrainObjects

    durable = str(tmp_path / "durable")
    local, piece = _local(tmp_path, durable, 5, th.rank_state(0, 5))
    ck = Checkpointer(durable)
    lineage = _Lineage()
    loop = CheckpointedLoop(
        LoopSpec(max_steps=5, ckpt_every=5),
        TrainObjects(None, None, None, None),
        ck=ck,
        dinfo=DistInfo(0, 1, 0, torch.device("cpu")),
        lineage=lineage,
    )
    uri = ck.storage.url(layout.step_dir(5))
    loop.pending.append((drain(ck, local.storage, 5), 5, uri, "model-5"))
    loop._reap(block=True)
    [(step, got_uri, digest, sizes, model_id)] = lineage.checkpoints
    assert (step, got_uri, model_id) == (5, uri, "model-5")
    assert digest == rootreader.read_commit(ck.storage, 5)["manifest_xxh3"]
    assert sizes["kind"] == "full" and sizes["stored_bytes"] == piece.bytes
    [(metrics, at)] = lineage.metrics
    assert at == 5
    assert metrics["save_bytes_written"] == piece.bytes and lineage.failed == []
    assert loop.saved[-1][0].kind == KIND


def test_a_hostile_local_manifest_fails_the_drain_naming_it(tmp_path):
    """A local manifest whose checksum matches its COMMIT but whose parts are not part records
    (an unhashable object key) is one DrainError naming the file, nothing committed."""
    durable = str(tmp_path / "durable")
    local, _ = _local(tmp_path, durable, 5, th.rank_state(0, 5))
    st = local.storage
    commit_doc = rootreader.read_commit(st, 5)
    rel = f"{layout.step_dir(5)}/{layout.manifest_name(commit_doc['save_id'])}"
    m = json.loads(st.read(rel))
    next(iter(m["items"].values()))["parts"][0]["object"] = ["not", "a", "key"]
    blob = json.dumps(m).encode()
    st.write(rel, blob)
    commit_doc["manifest_xxh3"] = codec.digest(blob)
    st.write(layout.commit_path(5), json.dumps(commit_doc).encode())
    with pytest.raises(DrainError, match=r"step-0*5/manifest-\w+\.json: manifest field items"):
        drain(_durable(durable), st, 5).wait()
    assert not Storage(durable).exists(layout.commit_path(5))


class _GcMidway(Storage):
    """A durable root where a `ckptflow ckpt gc` (grace 0, a minute ahead) runs just before
    the drain's last object upload: it must not free the objects already uploaded."""

    def __init__(self, *a, objects: int, **kw):
        super().__init__(*a, **kw)
        self.left, self.lock, self.report = objects, threading.Lock(), None

    def write(self, rel, data, **kw):
        if rel.startswith(f"{layout.OBJECTS}/"):
            with self.lock:
                self.left -= 1
                if self.left == 0:
                    when = time.time() + 60
                    self.report = gc(self.uri, "last=1", apply=True, grace_s=0, now=when)
        return super().write(rel, data, **kw)


def test_a_gc_during_the_drain_frees_none_of_its_uploads(tmp_path):
    """The drain keeps a save's intent with its heartbeat (save_intent.py): GC sees it live
    and keeps every object written since it started, though none is referenced yet."""
    durable = str(tmp_path / "durable")
    Checkpointer(durable).save(1, {"other": torch.ones(1000)})
    local, piece = _local(tmp_path, durable, 5, th.rank_state(0, 5))
    ck = Checkpointer(durable, storage=_GcMidway(durable, objects=len(piece.objects)))
    drain(ck, local.storage, 5).wait()
    assert ck.storage.report is not None and ck.storage.report.applied
    Checkpointer(durable).verify(5)

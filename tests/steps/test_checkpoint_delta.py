"""Incremental (delta) and deduplicated checkpoints."""

from __future__ import annotations

import os
import time

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer, CorruptCheckpoint
from fsspec.implementations.local import LocalFileSystem

from ckptflow.core import layout
from ckptflow.core.storage import Storage


def _adamw_like_update(state: dict, lr: float = 1e-4) -> None:
    g = torch.Generator().manual_seed(int(state["step"]))
    for k in ("w1", "w2"):
        state[k].add_(torch.randn(state[k].shape, generator=g) * lr)


def test_full_every_k_makes_deltas_against_the_last_full(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"), full_every=3)
    g = torch.Generator().manual_seed(0)
    state = {
        "w1": torch.randn(256, 256, generator=g) * 0.02,
        "w2": torch.randn(256, generator=g),
        "step": 0,
    }
    for step in range(1, 8):
        state["step"] = step
        _adamw_like_update(state)
        ck.save(step, state)
        t = {"w1": torch.zeros(256, 256), "w2": torch.zeros(256), "step": None}
        Checkpointer(str(tmp_path / "r")).load(t, step=step)
        assert torch.equal(t["w1"], state["w1"]) and t["step"] == step
    kinds = [(s, ck.manifest(s)["kind"], ck.manifest(s)["base_step"]) for s in range(1, 8)]
    assert kinds == [
        (1, "full", None),
        (2, "delta", 1),
        (3, "delta", 1),
        (4, "full", None),
        (5, "delta", 4),
        (6, "delta", 4),
        (7, "full", None),
    ]
    full, delta = ck.manifest(4)["stats"]["new_bytes"], ck.manifest(5)["stats"]["new_bytes"]
    # Dense updates of 0.5% flip the low 16 mantissa bits at random: about half the raw size.
    assert delta < 0.8 * full, (delta, full)


def test_sparse_updates_make_tiny_deltas(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"), full_every=5)
    state = {"emb": torch.randn(1000, 64)}
    ck.save(1, state)
    state["emb"][:10] += 0.01  # 1% of the rows trained, as for an embedding
    ck.save(2, state)
    full, delta = ck.manifest(1)["stats"]["new_bytes"], ck.manifest(2)["stats"]["new_bytes"]
    assert delta < 0.1 * full, (delta, full)
    t = {"emb": torch.zeros(1000, 64)}
    ck.load(t, step=2)
    assert torch.equal(t["emb"], state["emb"])


def test_needs_includes_the_base_and_a_corrupt_base_fails_the_delta(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"), full_every=10)
    state = {"w": torch.randn(128, 128)}
    ck.save(1, state)
    state["w"][0, :4] += 1.0
    ck.save(2, state)
    m2 = ck.manifest(2)
    base_key = m2["items"]["w@0,0"]["parts"][0]["base"]["object"]
    assert base_key in ck.needs(2) and base_key in ck.needs(1)
    ck.storage.write(layout.object_path(base_key), b"corrupt")
    with pytest.raises(CorruptCheckpoint, match=base_key):
        ck.load({"w": torch.zeros(128, 128)}, step=2)


def test_frozen_tensors_are_stored_once(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"))
    frozen = {f"layer{i}": torch.randn(128, 128) for i in range(19)}
    state = {**frozen, "head": torch.randn(128, 128)}
    ck.save(1, state)
    for step in (2, 3):
        state["head"].add_(0.01)
        ck.save(step, state)
    m1, m3 = ck.manifest(1), ck.manifest(3)
    assert m3["stats"]["new_bytes"] < 0.1 * m1["stats"]["new_bytes"]

    def stored(m, fqn):  # the bytes a part references: its object (and span of a pack)
        (p,) = m["items"][f"{fqn}@0,0"]["parts"]
        return p["object"], p.get("span")

    for k in frozen:
        assert stored(m1, k) == stored(m3, k), f"{k} references the bytes step 1 stored"
    assert stored(m1, "head") != stored(m3, "head")
    t = {k: torch.zeros(128, 128) for k in state}
    ck.load(t, step=3)
    assert all(torch.equal(t[k], state[k]) for k in state)


def test_dedup_survives_a_restart_via_load(tmp_path):
    state = {"frozen": torch.randn(256, 256), "head": torch.randn(8)}
    Checkpointer(str(tmp_path / "r")).save(1, state)
    ck = Checkpointer(str(tmp_path / "r"))  # a restarted job: load, then save
    ck.load({"frozen": torch.zeros(256, 256), "head": torch.zeros(8)})
    state["head"].add_(1)
    ck.save(2, state)
    assert ck.manifest(2)["stats"]["new_bytes"] < 1024


def _rot(ck: Checkpointer, key: str) -> None:
    """Bit rot: one byte of a stored object flips; its size stays the same."""
    rel = layout.object_path(key)
    blob = bytearray(ck.storage.read(rel))
    blob[len(blob) // 2] ^= 0x10
    ck.storage.write(rel, bytes(blob))


@pytest.mark.parametrize("pack_kib", [0, 1024], ids=["own-object", "packed"])
@pytest.mark.parametrize("process", ["same", "restarted"])
def test_dedup_never_references_a_rotted_object(tmp_path, process, pack_kib):
    """A rotted object of the right size is not referenced: its bytes are written again and
    the new step is sound. In its own object the rewrite, under the same name, repairs the
    older step too; in a pack that also holds a part that changed (`model.step` here) it
    goes to a new pack, and the older step stays corrupt, as verify says."""
    root = str(tmp_path / "r")
    ck = Checkpointer(root, pack_kib=pack_kib)
    state = {"model": {"frozen": torch.randn(64, 64), "step": 1}}
    ck.save(1, state)
    key = ck.manifest(1)["items"]["model.frozen@0,0"]["parts"][0]["object"]
    _rot(ck, key)
    if process == "restarted":  # the object is found on disk, not in the last save's records
        ck = Checkpointer(root, pack_kib=pack_kib)
    state["model"]["step"] = 2
    stats = ck.save(2, state).wait()
    assert stats.bytes_written > 64 * 64, "the rotted part was written again"
    ck.verify(2)
    if pack_kib:
        with pytest.raises(CorruptCheckpoint, match="checksum"):
            ck.verify(1)
    else:
        ck.verify(1)
    t = {"model": {"frozen": torch.zeros(64, 64), "step": None}}
    ck.load(t, step=2)
    assert torch.equal(t["model"]["frozen"], state["model"]["frozen"])


def test_delta_never_references_a_rotted_base(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"), full_every=4)
    state = {"w": torch.randn(64, 64)}
    ck.save(1, state)
    _rot(ck, ck.manifest(1)["items"]["w@0,0"]["parts"][0]["object"])
    state["w"][0, :4] += 1.0
    ck.save(2, state)
    assert ck.manifest(2)["kind"] == "delta"
    ck.verify(2)
    t = {"w": torch.zeros(64, 64)}
    ck.load(t, step=2)
    assert torch.equal(t["w"], state["w"])


def test_dedup_never_references_a_missing_object(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"))
    state = {"frozen": torch.randn(64, 64), "head": torch.zeros(4)}
    ck.save(1, state)
    key = ck.manifest(1)["items"]["frozen@0,0"]["parts"][0]["object"]
    ck.storage.delete([layout.object_path(key)])
    state["head"] += 1
    ck.save(2, state)
    ck.verify(2)


class ObjectReadsFS(LocalFileSystem):
    """Counts reads of object files (inject via Storage(fs=))."""

    cachable = False

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.object_reads = 0

    def cat_file(self, path, *a, **kw):
        self.object_reads += f"/{layout.OBJECTS}/" in str(path)
        return super().cat_file(path, *a, **kw)


class AgedStorage(Storage):
    """Local storage whose files count as settled at once (no waiting out the clock tick)."""

    def fingerprint(self, rel):
        s = os.stat(self.path(rel))
        return (s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns)


def test_reused_objects_are_read_once_per_process_then_only_looked_at(tmp_path):
    """The cost of sound deduplication: a reused object is read back once, at its first
    reuse; later saves look at its fingerprint only; a load's verified reads count too."""
    root = str(tmp_path / "r")
    state = {f"frozen{i}": torch.randn(64, 64) for i in range(4)} | {"head": torch.zeros(4)}
    fs = ObjectReadsFS()
    # one object per part: the reads counted are those of each frozen part's object
    ck = Checkpointer("unused", storage=AgedStorage(root, fs=fs), pack_kib=0)
    reads = []
    for step in (1, 2, 3):
        state["head"] += 1
        fs.object_reads = 0
        ck.save(step, state)
        reads.append(fs.object_reads)
    frozen = len(ck.manifest(1)["objects"]) - 1  # less the head's
    assert reads == [0, frozen, 0], reads
    for e in ck.storage.walk(layout.OBJECTS):  # new fingerprints: what this process saw is stale
        os.utime(ck.storage.path(e.path), ns=(1, 1))
    fs2 = ObjectReadsFS()
    restarted = Checkpointer("unused", storage=AgedStorage(root, fs=fs2), pack_kib=0)
    restarted.load({k: torch.zeros_like(v) for k, v in state.items()})
    fs2.object_reads = 0
    state["head"] += 1
    restarted.save(4, state)
    assert fs2.object_reads == 0, "objects the load verified are not read again"


def test_a_local_fingerprint_waits_for_the_clock_tick_and_sees_a_rewrite(tmp_path):
    st = Storage(str(tmp_path))
    st.write("f", b"12345678")
    assert st.fingerprint("f") is None, "too fresh: a rewrite in the same tick could hide"
    time.sleep(2.1)
    before = st.fingerprint("f")
    assert before is not None and st.fingerprint("f") == before
    st.write("f", b"87654321")  # same size, other bytes
    time.sleep(2.1)
    assert st.fingerprint("f") not in (None, before)
    with pytest.raises(FileNotFoundError):
        st.fingerprint("absent")


@pytest.mark.parametrize("pack_kib", [0, 1024], ids=["own-object", "packed"])
def test_a_fine_tune_never_references_a_rotted_parent_object(tmp_path, pack_kib):
    base = Checkpointer(str(tmp_path / "base"), pack_kib=pack_kib)
    state = {"frozen": torch.randn(64, 64), "head": torch.zeros(4)}
    base.save(1, state)
    key = base.manifest(1)["items"]["frozen@0,0"]["parts"][0]["object"]
    ft = Checkpointer(str(tmp_path / "ft"), pack_kib=pack_kib)
    ft.inherit(base, 1)
    _rot(base, key)
    state["head"] += 1
    ft.save(1, state)
    ft.verify(1)
    (part,) = ft.manifest(1)["items"]["frozen@0,0"]["parts"]
    assert part["object"] == key or pack_kib, "in its own object: rewritten under its name"
    assert ft.storage.exists(layout.object_path(part["object"])), "a sound copy in the child"


def test_dense_small_updates_store_the_integer_difference(tmp_path):
    """Small dense updates: the zigzag-coded difference beats XOR (format version 3)."""
    ck = Checkpointer(str(tmp_path / "r"), full_every=5)
    g = torch.Generator().manual_seed(0)
    state = {"w": torch.randn(256, 256, generator=g) * 0.02}
    ck.save(1, state)
    state["w"].add_(torch.randn(256, 256, generator=g) * 1e-4)
    ck.save(2, state)
    m = ck.manifest(2)
    part = m["items"]["w@0,0"]["parts"][0]
    assert m["format_version"] >= 3 and part["base"] is not None and part["delta"] == "sub"
    t = {"w": torch.zeros(256, 256)}
    Checkpointer(str(tmp_path / "r")).load(t, step=2)
    assert torch.equal(t["w"], state["w"])


def test_a_tensor_whose_delta_never_pays_is_stored_full_without_delta_work(tmp_path, monkeypatch):
    """Like AdamW's exp_avg: found at the first delta, then stored full with no delta tried."""
    from ckptflow.core import deltas

    sizes = []
    real = deltas.choose_delta
    monkeypatch.setattr(
        deltas, "choose_delta", lambda raw, *a, **kw: sizes.append(len(raw)) or real(raw, *a, **kw)
    )
    ck = Checkpointer(str(tmp_path / "r"), full_every=3)
    g = torch.Generator().manual_seed(1)
    state = {"w": torch.randn(128, 128, generator=g) * 0.02, "m": torch.randn(64, 64, generator=g)}
    kinds = {}
    for step in range(1, 7):  # full 1, deltas 2-3, full 4, deltas 5-6
        state["w"].add_(torch.randn(128, 128, generator=g) * 1e-4)
        state["m"] = torch.randn(64, 64, generator=g)  # new values each step: no delta pays
        ck.save(step, state)
        man = ck.manifest(step)
        kinds[step] = [man["items"][k]["parts"][0]["base"] is None for k in ("w@0,0", "m@0,0")]
        t = {"w": torch.zeros(128, 128), "m": torch.zeros(64, 64)}
        Checkpointer(str(tmp_path / "r")).load(t, step=step)
        assert torch.equal(t["w"], state["w"]) and torch.equal(t["m"], state["m"])
    assert [kinds[s] for s in (2, 3, 5, 6)] == [[False, True]] * 4
    assert sizes.count(64 * 64 * 4) == 1, "the delta of m was tried once only"
    assert sizes.count(128 * 128 * 4) == 4


def _v2_states():
    """The states tests/fixtures/ckpt_v2_delta was saved from (by ckptflow at format 2)."""
    g = torch.Generator().manual_seed(2)
    s1 = {"w": torch.randn(64, 32, generator=g) * 0.02, "ids": torch.arange(16), "lr": 0.1}
    s2 = {"w": s1["w"] + torch.randn(64, 32, generator=g) * 1e-4, "ids": s1["ids"] + 1}
    return s1, {**s2, "lr": 0.05}


def test_a_version_2_delta_checkpoint_still_loads(tmp_path):
    import shutil
    from pathlib import Path

    fixture = Path(__file__).parents[1] / "fixtures" / "ckpt_v2_delta" / "root"
    root = shutil.copytree(fixture, tmp_path / "r")
    ck = Checkpointer(str(root))
    m = ck.manifest(2)
    assert m["format_version"] == 2 and m["kind"] == "delta"
    assert all("delta" not in p for it in m["items"].values() for p in it["parts"])
    for step, want in zip((1, 2), _v2_states(), strict=True):
        t = {"w": torch.zeros(64, 32), "ids": torch.zeros(16, dtype=torch.int64), "lr": None}
        ck.load(t, step=step)
        assert torch.equal(t["w"], want["w"]) and torch.equal(t["ids"], want["ids"])
        assert t["lr"] == want["lr"]
    ck.verify(2)

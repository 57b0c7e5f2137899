"""The encode/decode path: tuned zstd stays readable both ways, the adaptive codec, in-place
decoding into the destination, and per-file durability instead of a whole-host sync."""

from __future__ import annotations

import os
import shutil
import threading
import time
import tracemalloc

import numpy as np
import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer

from ckptflow.core import adaptive, codec, layout, localio
from ckptflow.core.errors import CorruptCheckpoint
from ckptflow.core.storage import Storage
from tests.core.test_codec import _plain_decode

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "ckpt", "before-tuned-zstd")


def _fixture_state() -> dict:
    """The state tests/fixtures/ckpt/before-tuned-zstd holds (step 3), written by ckptflow
    before the tuned zstd parameters (zstd level 1 frames, one os.sync per save)."""
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(256, 64, generator=g) * 0.02,
        "h": (torch.randn(128, 64, generator=g) * 0.02).to(torch.bfloat16),
        "i": torch.arange(1000, dtype=torch.int64),
        "meta": {"lr": 0.001, "name": "fixture"},
    }


def _zeros_like(state: dict) -> dict:
    return {
        k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else {"lr": 0.0, "name": ""}
        for k, v in state.items()
    }


def test_a_checkpoint_written_before_the_tuned_parameters_loads(tmp_path):
    root = tmp_path / "old"
    shutil.copytree(FIXTURE, root)
    want = _fixture_state()
    got = _zeros_like(want)
    assert Checkpointer(str(root)).load(got) == 3
    for k in ("w", "h", "i"):
        assert torch.equal(got[k], want[k]), k
    assert got["meta"] == want["meta"]


def test_a_checkpoint_written_now_decodes_with_the_old_decoder(tmp_path):
    state = _fixture_state()
    ck = Checkpointer(str(tmp_path / "new"), compress=True)
    ck.save(1, state)
    m = ck.manifest(1)
    st = Storage(str(tmp_path / "new"))
    zstd_planes = 0
    for fqn in ("w", "h"):
        (item,) = [it for it in m["items"].values() if it["fqn"] == fqn]
        (part,) = item["parts"]
        blob = st.read(layout.object_path(part["object"]))
        start, length = part.get("span", (0, len(blob)))  # a small part: its span of a pack
        raw = _plain_decode(
            blob[start : start + length], part["planes"], part["width"], part["raw_size"]
        )
        assert raw.tobytes() == state[fqn].reshape(-1).view(torch.uint8).numpy().tobytes()
        zstd_planes += [c for c, _ in part["planes"]].count("zstd")
    assert zstd_planes >= 2


def _planes(ck: Checkpointer, fqn: str = "w") -> list:
    m = ck.manifest(1)
    return [p["planes"] for it in m["items"].values() if it["fqn"] == fqn for p in it["parts"]]


def _primed(root: str, storage_s: float) -> None:
    """Give the root's estimates, with enough evidence: the storage's seconds per stored byte,
    and CPU seconds per raw byte of 1 ns raw and 3 ns compressed to half."""
    p = adaptive.policy_for(Storage(root).location(), 1)
    ev = adaptive.MIN_EVIDENCE
    p.costs.storage.estimate.add(ev, storage_s * ev)
    p.observe(False, ev, 1e-9 * ev, ev)
    p.observe(True, ev, 3e-9 * ev, ev // 2)


def test_auto_stores_raw_on_storage_faster_than_the_encoder_and_compresses_on_slow(tmp_path):
    state = {
        "w": torch.randn(1024, 512, generator=torch.Generator().manual_seed(1)) * 0.02,
        "b": torch.randn(1000, generator=torch.Generator().manual_seed(3)) * 0.02,
    }
    fast, slow = str(tmp_path / "fast"), str(tmp_path / "slow")
    _primed(fast, storage_s=1e-12)  # storage far faster than any compressor
    _primed(slow, storage_s=1e-3)  # a kilobyte per second: compressing pays
    ck_fast, ck_slow = Checkpointer(fast), Checkpointer(slow)
    ck_fast.save(1, state)
    ck_slow.save(1, state)
    assert _planes(ck_fast) == [[["raw", 1024 * 512 * 4]]]  # stored whole, ungrouped
    assert _planes(ck_slow)[0][-1][0] == "zstd"  # the sign/exponent plane
    # A part too small to measure (packed) goes the way the root's estimates favour.
    assert _planes(ck_fast, "b") == [[["raw", 4000]]]
    assert len(_planes(ck_slow, "b")[0]) == 4  # grouped into its four byte planes
    forced = Checkpointer(fast, compress=True)  # True forces compression whatever the speed
    forced.save(2, state)
    assert [it for it in forced.manifest(2)["items"].values()][0]["parts"][0]["planes"][-1][
        0
    ] == "zstd"
    for ck in (ck_fast, ck_slow):
        t = {"w": torch.zeros(1024, 512), "b": torch.zeros(1000)}
        ck.load(t, step=1)
        assert torch.equal(t["w"], state["w"]) and torch.equal(t["b"], state["b"])


def test_auto_measures_compression_on_samples_of_raw_parts_not_whole_compressed_ones(tmp_path):
    """A fresh root (a fresh process: every save of a job that restarts) knows neither cost:
    its parts go raw while a sample of each is encoded to measure compressing (compressing
    whole parts only to measure them cost a first save ~20% of its bytes compressed)."""
    root = str(tmp_path / "fresh")
    state = {"w": torch.randn(1024, 1024, generator=torch.Generator().manual_seed(2)) * 0.02}
    ck = Checkpointer(root, part_mib=1)  # four 1 MiB parts: under MIN_EVIDENCE, all measuring
    ck.save(1, state)
    assert _planes(ck) == [[["raw", 1 << 20]]] * 4
    p = adaptive.policy_for(Storage(root).location(), 1)
    assert p.costs.cpu_raw.evidence == 4 << 20  # each part's CPU, and each sample: its part
    assert p.costs.cpu_packed.evidence == p.costs.ratio.evidence == 4 << 20
    assert p.costs.storage.estimate.evidence >= 4 << 20  # every object written


def test_once_compressing_wins_every_part_is_compressed_and_still_measures_raw(tmp_path):
    """One part in 16 was stored raw to keep the raw mode's CPU estimate fresh: 6% of a save's
    bytes stored 1/0.81 larger (~40 GB of a 3.5 TB checkpoint) to measure what a compressed
    part measures too, the writer's CPU but its coding."""
    root = str(tmp_path / "slow")
    _primed(root, storage_s=1e-3)  # compressing pays
    p = adaptive.policy_for(Storage(root).location(), 1)
    before = p.costs.cpu_raw.evidence
    state = {"w": torch.randn(5 << 20, generator=torch.Generator().manual_seed(6)) * 0.02}
    ck = Checkpointer(root, part_mib=1)  # 20 parts of 1 MiB: more than EXPLORE decisions
    ck.save(1, state)
    planes = _planes(ck)
    assert len(planes) > adaptive.EXPLORE
    assert all(pl[-1][0] == "zstd" for pl in planes), planes
    assert p.costs.cpu_raw.evidence - before == len(planes) << 20  # every part measured it
    assert p.costs.cpu_raw.value() < p.costs.cpu_packed.value()


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_compress_must_be_true_false_or_auto(tmp_path, bad):
    with pytest.raises(ValueError, match="compress"):
        Checkpointer(str(tmp_path / "r"), compress=bad)


class NoWholeHostSync(Storage):
    """A root whose whole-host flush must not be needed: each save syncs its own files."""

    def flush(self) -> None:
        raise AssertionError("a save synced the whole host")


@pytest.mark.parametrize("compress", ["auto", True, False])
def test_a_save_syncs_its_own_files_not_the_whole_host(tmp_path, compress):
    root = str(tmp_path / "r")
    ck = Checkpointer("unused", storage=NoWholeHostSync(root), compress=compress, part_mib=1)
    state = {"w": torch.randn(1024, 600) * 0.02, "b": torch.arange(10)}
    ck.save(1, state)
    t = {"w": torch.zeros(1024, 600), "b": torch.zeros(10, dtype=torch.int64)}
    ck.load(t)
    assert torch.equal(t["w"], state["w"]) and torch.equal(t["b"], state["b"])


def test_a_load_decodes_into_the_destination_tensors_in_place(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"), part_mib=1)
    state = {"w": torch.randn(1024, 600) * 0.02, "v": torch.randn(7).to(torch.bfloat16)}
    ck.save(1, state)
    target = {"w": torch.zeros(1024, 600), "v": torch.zeros(7, dtype=torch.bfloat16)}
    ptrs = {k: v.data_ptr() for k, v in target.items()}
    ck.load(target)
    for k in state:
        assert target[k].data_ptr() == ptrs[k]
        assert torch.equal(target[k], state[k])
    # A non-contiguous destination is filled through a copy, with the same result.
    wide = torch.zeros(600, 1024).t()
    ck.load({"w": wide, "v": target["v"]})
    assert torch.equal(wide, state["w"])


def test_raw_parts_are_stored_whole_and_read_back(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"), compress=False, part_mib=1)
    w = torch.from_numpy(np.random.default_rng(3).standard_normal(600_001).astype(np.float32))
    ck.save(1, {"w": w})
    assert all(len(p) == 1 and p[0][0] == "raw" for p in _planes(ck))
    t = {"w": torch.zeros_like(w)}
    ck.load(t)
    assert torch.equal(t["w"], w)
    assert ck.verify(1)["objects"] == 3


def _load_peak(ck: Checkpointer, target: dict) -> int:
    """Bytes numpy/Python allocated at peak during a load (tracemalloc sees numpy's buffers)."""
    tracemalloc.start()
    try:
        ck.load(target)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_part_stored_raw_is_read_straight_into_its_destination(tmp_path):
    """No read buffer of a raw part's size: the file is read into the destination tensor's
    bytes and verified there, through at most one bounce block when it is read with O_DIRECT
    (the compressed control needs a buffer of the part's stored size)."""
    w = torch.from_numpy(np.random.default_rng(4).standard_normal(1 << 23).astype(np.float32))
    peaks = {}
    for compress in (False, True):
        ck = Checkpointer(str(tmp_path / f"r{compress}"), compress=compress, threads=1)
        ck.save(1, {"w": w})
        t = {"w": torch.zeros_like(w)}
        peaks[compress] = _load_peak(ck, t)
        assert torch.equal(t["w"], w)
    block = localio.READ_BLOCK + (2 << 20)
    assert peaks[False] < block < (24 << 20) < peaks[True], peaks  # the part: 32 MiB


def test_a_corrupt_raw_part_read_into_its_destination_fails_the_load(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"), compress=False)
    w = torch.randn(1 << 16)
    ck.save(1, {"w": w})
    (part,) = next(iter(ck.manifest(1)["items"].values()))["parts"]
    path = ck.storage.path(layout.object_path(part["object"]))
    with open(path, "rb") as f:
        blob = bytearray(f.read())
    blob[100] ^= 1
    with open(path, "wb") as f:
        f.write(blob)
    with pytest.raises(CorruptCheckpoint, match="checksum"):
        ck.load({"w": torch.zeros_like(w)}, step=1)


def test_auto_on_storage_faster_than_the_encoder_never_stores_a_delta_raw(tmp_path):
    """Where raw wins, full parts go raw, but a delta is compressed: its unchanged bits are
    zero bytes that cost nothing only compressed (a raw delta would take the part's bytes and
    still need its base)."""
    root = str(tmp_path / "r")
    _primed(root, storage_s=1e-12)
    ck = Checkpointer(root, full_every=5)
    g = torch.Generator().manual_seed(2)
    state = {"w": torch.randn(1024, 512, generator=g) * 0.02}
    ck.save(1, state)
    (full,) = ck.manifest(1)["items"]["w@0,0"]["parts"]
    assert full["planes"] == [["raw", 1024 * 512 * 4]]
    state["w"].add_(torch.randn(1024, 512, generator=g) * 1e-4)
    ck.save(2, state)
    (part,) = ck.manifest(2)["items"]["w@0,0"]["parts"]
    assert part["base"] is not None and "zstd" in [c for c, _ in part["planes"]]
    assert part["stored_size"] < 0.9 * full["stored_size"]
    t = {"w": torch.zeros(1024, 512)}
    Checkpointer(root).load(t, step=2)
    assert torch.equal(t["w"], state["w"])


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_local_load_keeps_one_read_ahead_of_its_decode_threads(tmp_path, monkeypatch, threads):
    """A cold local load waits on the disk: with only `threads` reads in flight the device sat
    idle while each thread verified and placed what it had read (1 GiB cold here, 2 threads:
    2 reads in flight 0.77 s, 3 0.71 s). Each read holds a whole object's buffer, so no more:
    4 in flight (two per thread) were no faster (0.72 s), slower warm on two cores, and held
    4 x 53 MiB (0.16-0.19 GiB per GiB of extra peak RSS, against 0.12-0.16 with 3)."""
    ck = Checkpointer(str(tmp_path / "r"), compress=False, threads=threads, part_mib=1)
    state = {f"w{i}": torch.randn(1 << 18) for i in range(8)}  # 1 MiB each: 8 objects
    ck.save(1, state)
    inflight, peak, lock = [0], [0], threading.Lock()
    real = localio.read_into

    def slow_read_into(f, expect, get_buf, **kw):
        with lock:
            inflight[0] += 1
            peak[0] = max(peak[0], inflight[0])
        time.sleep(0.05)  # a disk read long enough for another to start meanwhile
        try:
            return real(f, expect, get_buf, **kw)
        finally:
            with lock:
                inflight[0] -= 1

    monkeypatch.setattr(localio, "read_into", slow_read_into)
    got = {k: torch.zeros_like(v) for k, v in state.items()}
    ck.load(got, step=1)
    assert all(torch.equal(got[k], v) for k, v in state.items())
    assert peak[0] == threads + 1, peak


def test_auto_counts_the_sync_a_raw_object_waits_for(tmp_path, monkeypatch):
    """A virtual disk takes O_DIRECT writes into its host's cache at once and pays at the
    flush: measured without the sync, storing raw looked nearly free, and `auto` stored raw
    where compressing made the save 1.4x faster (1 GiB here: 2.64 s compressed, 3.83 s raw)."""
    real = localio.datasync

    def flush_paid_per_byte(path: str) -> None:  # 100 ms per MiB, at the sync
        real(path)
        time.sleep(os.path.getsize(path) / (1 << 20) * 0.1)

    monkeypatch.setattr(localio, "datasync", flush_paid_per_byte)
    g = torch.Generator().manual_seed(4)
    # bf16 values held in fp32: the low mantissa bytes are zero, compressing halves them
    state = {"w": (torch.randn(2048, 1024, generator=g) * 0.02).bfloat16().float()}
    root = str(tmp_path / "flush-paid")
    ck = Checkpointer(root, part_mib=1)  # 8 parts of 1 MiB: the first save measures
    ck.save(1, state)
    assert all(pl == [["raw", 1 << 20]] for pl in _planes(ck))  # measuring: raw, sampled
    ck.save(2, {"w": state["w"] + 1.0})
    planes = [it for it in ck.manifest(2)["items"].values() if it["fqn"] == "w"][0]["parts"]
    compressed = sum(any(c == "zstd" for c, _ in p["planes"]) for p in planes)
    assert compressed == len(planes), planes


def _encode_cpu_per_byte(raw: np.ndarray) -> float:
    """CPU seconds per raw byte this machine's encoder spends compressing `raw` (best of 3)."""
    best = float("inf")
    for _ in range(3):
        t0 = time.thread_time()
        codec.encode(raw, 4, 1, True).digest()
        best = min(best, time.thread_time() - t0)
    return best / len(raw)


def test_auto_compresses_where_encoding_overlaps_the_other_threads_writes(tmp_path, monkeypatch):
    """One device shared by the writer threads (a disk): while one thread encodes, the other
    writes, so compressing costs the device only the bytes it stores. Priced per thread as
    if each encoded and then wrote alone, `auto` stored raw on this machine's own disk where
    compressing made a 1 GiB save 1.2-1.3x faster (2.06 s compressed, 2.62 s raw). Here the
    device takes 1.5x what the encoder spends per byte: raw waits on it for every byte,
    compressed for ~0.83 of them while encoding on the other core."""
    g = torch.Generator().manual_seed(5)
    state = {"w": torch.randn(2048, 1024, generator=g) * 0.02}
    raw = state["w"].reshape(-1)[: 1 << 18].numpy().view(np.uint8)
    device_s = 1.5 * _encode_cpu_per_byte(raw)  # per byte stored
    device = threading.Lock()
    real = localio.datasync

    def shared_device(path: str) -> None:  # one device: a write's bytes go through it alone
        real(path)
        with device:
            time.sleep(os.path.getsize(path) * device_s)

    monkeypatch.setattr(localio, "datasync", shared_device)
    root = str(tmp_path / "shared-device")
    ck = Checkpointer(root, part_mib=1, threads=2)  # 8 parts of 1 MiB: the first save measures
    ck.save(1, state)
    ck.save(2, {"w": state["w"] + 1.0})
    planes = [it for it in ck.manifest(2)["items"].values() if it["fqn"] == "w"][0]["parts"]
    compressed = sum(any(c == "zstd" for c, _ in p["planes"]) for p in planes)
    assert compressed == len(planes), planes

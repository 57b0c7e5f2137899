"""The adaptive codec's decision: a part is compressed only when that makes the save cheaper,
with the storage's busy time and the writers' CPU measured apart (the storage is shared by the
writer threads; one thread's encoding overlaps another's write). Compressing is measured on a
sample of a part stored raw, so finding out costs little."""

from __future__ import annotations

import os

import numpy as np
import pytest

from ckptflow.core import adaptive, codec

EV = adaptive.MIN_EVIDENCE


def _policy(
    storage: float | None,
    cpu_raw: float | None = 0.6e-9,
    cpu_packed: float | None = 1.8e-9,
    ratio: float | None = 0.81,
    workers: int = 2,
    cores: int = 2,
    overlapped: bool = False,
) -> adaptive.Policy:
    """A policy whose estimates are these per-byte figures, each with enough evidence (None:
    not measured yet)."""
    costs = adaptive.Costs()
    for est, v in [
        (costs.storage.estimate, storage),
        (costs.cpu_raw, cpu_raw),
        (costs.cpu_packed, cpu_packed),
        (costs.ratio, ratio),
    ]:
        if v is not None:
            est.add(EV, v * EV)
    return adaptive.Policy(costs, workers, cores, overlapped=overlapped)


def _decisions(p: adaptive.Policy, n: int = 64) -> list[adaptive.Decision]:
    return [p.decide() for _ in range(n)]


def _choices(p: adaptive.Policy, n: int = 64) -> list[bool]:
    return [d.compress for d in _decisions(p, n)]


def test_the_cheaper_mode_is_chosen_and_raw_explores_compressing_on_samples():
    slow_disk = _decisions(_policy(storage=10e-9))  # bytes saved outweigh zstd
    fast_disk = _decisions(_policy(storage=0.2e-9))  # storage outruns the encoder
    n = len(slow_disk)
    # Compressing wins: every part compressed. One in EXPLORE was stored raw to measure the
    # raw mode, which a compressed part measures too (its CPU but the coding): on a 3.5 TB
    # checkpoint those parts stored ~40 GB more, for nothing learnt.
    assert all(d.compress for d in slow_disk)
    assert not any(d.sample for d in slow_disk)
    # Raw wins: every part raw, one in EXPLORE also sampled (compressing measured cheaply).
    assert not any(d.compress for d in fast_disk)
    assert sum(d.sample for d in fast_disk) == n // adaptive.EXPLORE


def test_a_disk_shared_by_two_writers_is_priced_once_not_per_thread():
    """This machine's disk, measured (1 GiB, 2 writer threads, 2 cores): busy 2.4 s per GiB
    stored, 0.65 CPU-s per GiB raw, 1.8 compressed to 0.81. Compressed, the disk needs 1.9 s
    while the encoding (0.9 s per core) overlaps the other thread's write: 2.06 s measured,
    against 2.62 s raw. Priced per thread as if each encoded and then wrote alone, the
    compressed save looked 4.7 s per thread against 4.8, a coin toss that stored raw."""
    g = 1 << 30
    p = _policy(storage=2.4 / g, cpu_raw=0.65 / g, cpu_packed=1.8 / g, ratio=0.81)
    raw, packed = p.seconds()
    assert raw == pytest.approx(2.4 / g)  # the disk's time for every byte
    assert packed == pytest.approx(0.81 * 2.4 / g)  # for the bytes it stores
    assert p.decide().compress
    # One writer thread cannot overlap anything: its CPU and its write add up.
    alone = _policy(storage=2.4 / g, cpu_raw=0.65 / g, cpu_packed=1.8 / g, workers=1)
    raw1, packed1 = alone.seconds()
    assert raw1 == pytest.approx(3.05 / g) and packed1 == pytest.approx((1.8 + 0.81 * 2.4) / g)
    assert not alone.decide().compress


def test_a_writer_whose_writes_go_behind_its_encoding_overlaps_them_itself():
    """Local objects are written by I/O threads while the writer thread encodes its next part
    (write_behind.py): even one writer thread's CPU and writes overlap, and a save costs the
    larger of the storage's time and the CPU over the cores, not their sum."""
    g = 1 << 30
    alone = _policy(
        storage=2.4 / g, cpu_raw=0.65 / g, cpu_packed=1.8 / g, workers=1, overlapped=True
    )
    raw, packed = alone.seconds()
    assert raw == pytest.approx(2.4 / g) and packed == pytest.approx(1.944 / g)
    assert alone.decide().compress
    assert adaptive.save_seconds(1.8, 0.81, 2.4, 1, 2, overlapped=True) == pytest.approx(1.944)
    assert adaptive.save_seconds(1.8, 0.81, 2.4, 1, 2) == pytest.approx(1.8 + 1.944)


def test_the_cpu_is_spread_over_the_cores_the_writers_may_use_not_over_more():
    g = 1 << 30
    # 8 writers (uploads in flight) on 2 cores: the encoding takes 1.8 / 2 s per GiB, not / 8
    p = _policy(storage=0.5 / g, cpu_packed=1.8 / g, workers=8, cores=2)
    assert p.seconds()[1] == pytest.approx(0.9 / g)
    assert not p.decide().compress
    assert _policy(storage=0.5 / g, cpu_packed=1.8 / g, workers=8, cores=8).decide().compress


def test_until_every_estimate_is_measured_parts_go_raw_and_are_sampled():
    p = _policy(storage=None, cpu_raw=None, cpu_packed=None, ratio=None)
    assert p.decide() == adaptive.Decision(False, sample=True)
    meter = p.meter
    for _ in range(2):
        assert p.decide() == adaptive.Decision(False, sample=True)  # half the evidence
        meter.begin()
        meter.end(EV // 2)
        p.observe(False, EV // 2, 0.001, EV // 2)
        p.observe_sample(EV // 2, adaptive.SAMPLE, 1e-3, adaptive.SAMPLE // 2)
    assert p.seconds() is not None
    assert p.decide().sample is False  # decided now


def test_a_sample_stands_for_its_part_its_encoding_cpu_on_top_of_the_raw_cpu():
    p = _policy(storage=None, cpu_raw=None, cpu_packed=None, ratio=None)
    p.observe_sample(64 << 20, 1 << 20, 1e-3, 1 << 19)
    assert p.costs.cpu_packed.value() is None  # nothing to add it to before raw is measured
    p.observe(False, 64 << 20, 64 * 0.0005, 64 << 20)  # raw: 0.5 ms CPU per MiB
    p.observe_sample(64 << 20, 1 << 20, 0.002, 1 << 19)  # 2 ms per MiB, half the bytes
    assert p.costs.cpu_packed.evidence == 64 << 20
    assert p.costs.cpu_packed.value() * (1 << 20) == pytest.approx(0.0025)
    assert p.costs.ratio.value() == pytest.approx(0.5)


def test_a_compressed_part_observed_whole_gives_its_cpu_and_ratio():
    p = _policy(storage=None, cpu_raw=None, cpu_packed=None, ratio=None)
    p.observe(True, 64 << 20, 0.1, 16 << 20)
    assert p.costs.cpu_packed.value() == pytest.approx(0.1 / (64 << 20))
    assert p.costs.ratio.value() == pytest.approx(0.25)
    assert p.costs.cpu_raw.value() is None


def test_a_mode_that_becomes_cheaper_takes_over_as_the_storage_is_measured():
    """The storage is measured by every write, whichever mode: when the disk slows down, the
    next parts already know."""
    g = 1 << 30
    p = _policy(storage=0.2 / g)  # raw wins today
    assert _choices(p, 15).count(True) == 0
    for _ in range(8):  # the disk slows down: 10 s per GiB, measured by raw parts' writes
        p.costs.storage.estimate.add(64 << 20, 10 * (64 << 20) / g)
    assert _choices(p, 32).count(True) == 32  # every one: compressing measures raw too


class FakeTime:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_meter_counts_overlapping_writes_once_and_idle_time_never():
    """Two threads writing to one disk at once: each waits twice as long as it would alone;
    counted per write, the disk looked twice as slow as it is."""
    now = FakeTime()
    m = adaptive.StorageMeter(now)
    m.begin()  # t=0: a
    now.t = 1.0
    m.begin()  # t=1: b too
    now.t = 3.0
    m.end(100)  # a durable: 3 s busy for its 100 bytes
    assert m.estimate.value() == pytest.approx(0.03)
    now.t = 4.0
    m.end(100)  # b: 1 s more
    assert m.estimate.evidence == 200
    now.t = 10.0  # idle: nobody's
    m.begin()
    now.t = 10.5
    m.end(0)  # a failed write: its time goes to the next bytes made durable
    m.begin()
    now.t = 11.0
    m.end(100)
    e = adaptive.Estimate()
    for nbytes, busy in [(100, 3.0), (100, 1.0), (100, 1.0)]:
        e.add(nbytes, busy)
    assert m.estimate.value() == pytest.approx(e.value())


def test_estimates_are_weighted_by_bytes_and_kept_per_root_and_level():
    e = adaptive.Estimate()
    e.add(1 << 20, 1.0)  # ~1e-6 s/B
    first = e.value()
    e.add(1 << 30, 1.0)  # ~1e-9 s/B, and a large observation moves it most of the way
    assert 1.0 / (1 << 30) < e.value() < 0.25 * first
    a = adaptive.policy_for(("memory", "adaptive-a"), 1)
    b = adaptive.policy_for(("memory", "adaptive-b"), 1)
    a.observe(False, 64 << 20, 1.0, 64 << 20)
    assert b.costs.cpu_raw.value() is None and a.costs.cpu_raw.value() is not None
    assert adaptive.policy_for(("memory", "adaptive-a"), 1).costs is a.costs
    assert adaptive.policy_for(("memory", "adaptive-a"), 3).costs is not a.costs


def _floats(n: int = 1 << 16) -> np.ndarray:
    return (np.random.default_rng(0).standard_normal(n) * 0.02).astype(np.float32).view(np.uint8)


def test_a_part_stored_uncompressed_is_raw_and_ungrouped_and_compressed_ones_skip_noise():
    raw = _floats()
    plain = codec.encode(raw, 4, 1, False)
    assert plain.planes == [["raw", len(raw)]] and plain.chunks[0] is raw
    packed = codec.encode(raw, 4, 1, True)
    assert [c for c, _ in packed.planes] == ["raw", "raw", "raw", "zstd"]  # mantissas: noise
    for enc in (plain, packed):
        assert np.array_equal(codec.decode(enc.data, enc.planes, 4, len(raw)), raw)


def test_parts_too_small_to_measure_follow_the_favoured_mode_compressed_until_known():
    assert _policy(storage=None).favoured() is True
    assert _policy(storage=10e-9).favoured() is True
    p = _policy(storage=0.2e-9)
    assert [p.favoured() for _ in range(2 * adaptive.EXPLORE)] == [False] * 2 * adaptive.EXPLORE


def _cgroup(tmp_path, files: dict) -> str:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path)


@pytest.mark.parametrize(
    "files, quota",
    [
        ({"cpu.max": "400000 100000\n"}, 4.0),  # v2: a pod limited to 4 CPUs
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu.max": "max 100000\n"}, None),  # v2: no limit
        ({"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2.0),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),  # v1
        ({"cpu.max": "garbage\n"}, None),
        ({"cpu.max": "0 100000\n"}, None),
        ({}, None),  # no cgroup files: a host outside any container
    ],
)
def test_a_cgroup_cpu_quota_is_read_v2_or_v1(tmp_path, files, quota):
    assert adaptive.cpu_quota(_cgroup(tmp_path, files)) == quota


def test_the_cores_are_the_affinity_mask_capped_by_the_quota(tmp_path):
    """A pod limited to 1.5 CPUs on a bigger node: its encoding runs on 2 at most."""
    mask = len(os.sched_getaffinity(0))
    assert adaptive.usable_cores(_cgroup(tmp_path / "none", {})) == mask
    limited = _cgroup(tmp_path / "pod", {"cpu.max": "150000 100000\n"})
    assert adaptive.usable_cores(limited) == min(mask, 2)
    tiny = _cgroup(tmp_path / "tiny", {"cpu.max": "10000 100000\n"})  # 0.1 CPU
    assert adaptive.usable_cores(tiny) == 1


def test_the_cores_are_read_once_per_process_not_per_save(monkeypatch):
    # A policy is made for every save, on the path an async save stalls training on: reading
    # the cgroup's files there each time is a filesystem read per save (review of c0cc1ba).
    calls = []
    monkeypatch.setattr(adaptive, "usable_cores", lambda *a: calls.append(a) or 3)
    adaptive.process_cores.cache_clear()
    try:
        cores = [adaptive.Policy(adaptive.Costs()).cores for _ in range(3)]
    finally:
        adaptive.process_cores.cache_clear()
    assert cores == [3, 3, 3]
    assert len(calls) == 1

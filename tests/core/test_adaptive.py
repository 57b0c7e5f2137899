"""The adaptive codec's decision: a part is compressed only when that makes the save faster
on this root, priced as a pipeline (writer threads' CPU over the cores they have, against the
storage's busy time; estimates measured per mode; compressing measured on a sample of a part
stored raw, so finding out costs little)."""

from __future__ import annotations

import numpy as np
import pytest

from ckptflow.core import adaptive, codec


def _policy(raw_s, packed_s, evidence: int = adaptive.MIN_EVIDENCE, cores: int = 1):
    """Estimates of (CPU, device) seconds per byte for each mode; a number alone is CPU."""

    def est(s):
        if s is None:
            return adaptive.Estimate()
        cpu, device = s if isinstance(s, tuple) else (s, 0.0)
        return adaptive.Estimate(adaptive.Cost(cpu, device), evidence)

    return adaptive.Policy(est(raw_s), est(packed_s), cores)


def _decisions(p: adaptive.Policy, n: int = 64) -> list[adaptive.Decision]:
    return [p.decide() for _ in range(n)]


def _choices(p: adaptive.Policy, n: int = 64) -> list[bool]:
    return [d.compress for d in _decisions(p, n)]


def test_the_cheaper_mode_is_chosen_and_the_other_still_explored():
    slow_disk = _decisions(_policy(raw_s=10e-9, packed_s=3e-9))  # bytes saved outweigh zstd
    fast_disk = _decisions(_policy(raw_s=0.5e-9, packed_s=2e-9))  # storage outruns the encoder
    n = len(slow_disk)
    # Compressing wins: one part in EXPLORE is stored raw (measured whole, end to end).
    assert sum(d.compress for d in slow_disk) == n - n // adaptive.EXPLORE
    assert not any(d.sample for d in slow_disk)
    # Raw wins: every part raw, one in EXPLORE also sampled (compressing measured cheaply).
    assert not any(d.compress for d in fast_disk)
    assert sum(d.sample for d in fast_disk) == n // adaptive.EXPLORE


def test_until_both_modes_are_measured_parts_go_raw_and_are_sampled():
    p = _policy(raw_s=None, packed_s=None)
    assert p.decide() == adaptive.Decision(False, sample=True)
    p.observe(False, adaptive.MIN_EVIDENCE // 2, 0.01, 0.0)
    p.observe_sample(adaptive.MIN_EVIDENCE // 2, adaptive.SAMPLE, 1e-3, adaptive.SAMPLE // 2)
    assert p.decide() == adaptive.Decision(False, sample=True)  # half the evidence of each
    p.observe(False, adaptive.MIN_EVIDENCE // 2, 0.01, 0.0)
    p.observe_sample(adaptive.MIN_EVIDENCE // 2, adaptive.SAMPLE, 1e-3, adaptive.SAMPLE // 2)
    assert p.raw.value(adaptive.MIN_EVIDENCE) and p.packed.value(adaptive.MIN_EVIDENCE)
    assert p.decide().sample is False  # decided now


def test_a_sample_stands_for_its_part_encoding_time_plus_the_raw_cost_of_what_it_stores():
    p = _policy(raw_s=None, packed_s=None)
    p.observe_sample(64 << 20, 1 << 20, 1e-3, 1 << 19)
    assert p.packed.value() is None  # nothing to weigh it against before raw is measured
    p.observe(False, 64 << 20, 64 * 0.001, 64 * 0.004)  # raw: 1 ms CPU, 4 ms device per MiB
    p.observe_sample(64 << 20, 1 << 20, 0.003, 1 << 19)  # 3 ms per MiB, half the bytes left
    assert p.packed.evidence == 64 << 20
    cpu, device = (x * (1 << 20) for x in p.packed.value())
    assert cpu == pytest.approx(0.003 + 0.001 / 2) and device == pytest.approx(0.004 / 2)
    assert p.decide().compress  # 3.5 ms of CPU and 2 of device beat 4 of device, one core


def test_a_mode_that_becomes_cheaper_takes_over_through_exploration():
    p = _policy(raw_s=1e-9, packed_s=2e-9)  # raw wins today
    assert _choices(p, 15).count(True) == 0
    for _ in range(8):  # the disk slows down: explored compressed parts now cost less
        p.observe(False, 64 << 20, 0.064, 0.64)  # 10 ns/B of the device raw
        p.observe(True, 64 << 20, 0.128, 0.064)  # 2 ns/B of CPU compressed
    assert _choices(p, 32).count(True) == 30


def test_estimates_are_weighted_by_bytes_and_kept_per_root_and_level():
    e = adaptive.Estimate()
    e.add(1 << 20, 1.0, 2.0)  # ~1e-6 s/B of CPU, twice that of the device
    first = e.value()
    e.add(1 << 30, 1.0, 2.0)  # ~1e-9 s/B, and a large observation moves it most of the way
    assert 1.0 / (1 << 30) < e.value().cpu < 0.25 * first.cpu
    assert e.value().device == pytest.approx(2 * e.value().cpu)
    a = adaptive.policy_for(("memory", "adaptive-a"), 1)
    b = adaptive.policy_for(("memory", "adaptive-b"), 1)
    a.observe(False, 64 << 20, 1.0, 0.0)
    assert b.raw.value() is None and a.raw.value() is not None
    assert adaptive.policy_for(("memory", "adaptive-a"), 1).raw is a.raw
    assert adaptive.policy_for(("memory", "adaptive-a"), 3).raw is not a.raw


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
    assert _policy(raw_s=None, packed_s=None).favoured() is True
    assert _policy(raw_s=10e-9, packed_s=3e-9).favoured() is True
    p = _policy(raw_s=0.5e-9, packed_s=2e-9)
    assert [p.favoured() for _ in range(2 * adaptive.EXPLORE)] == [False] * 2 * adaptive.EXPLORE


@pytest.mark.parametrize("sync_first", [True, False])
def test_a_part_s_cost_is_its_thread_time_plus_its_sync_share_whichever_comes_last(sync_first):
    """A local object is made durable by another thread after the write: the part is observed
    once, when both halves are in, and a sample is priced against the raw cost with the sync
    in it (a disk that takes writes into a cache and pays at the flush)."""
    p = _policy(raw_s=None, packed_s=None)
    cost = adaptive.PartCost(p, False, 1 << 20)

    def thread():
        cost.thread(0.010, 0.002, (1 << 20, 0.005, 1 << 19))

    def synced():
        cost.synced(0.030)

    first, second = (synced, thread) if sync_first else (thread, synced)
    first()
    assert p.raw.evidence == 0  # not observed on one half
    second()
    assert p.raw.cost.cpu == pytest.approx(0.010 / (1 << 20))
    assert p.raw.cost.device == pytest.approx(0.032 / (1 << 20))  # the write's and the sync's
    # the sample: its encoding plus the raw cost (sync included) of half the bytes
    assert p.packed.cost.cpu == pytest.approx((0.005 + 0.005) / (1 << 20))
    assert p.packed.cost.device == pytest.approx(0.016 / (1 << 20))
    assert p.raw.evidence == p.packed.evidence == 1 << 20


def test_compressing_pays_when_the_storage_is_the_bottleneck_though_it_costs_a_thread_more():
    """Like this VM on a slow day: raw 0.5 ns/B of CPU and 6 ns/B of the disk (its flush),
    encoding 7 ns/B of CPU, 0.68 of the bytes left. One thread serially pays more to compress
    (7 + 0.68 * 6.5 > 6.5), but with two cores the encoding hides behind the disk, which then
    has 0.68 of the bytes to write: whole saves compressed took 0.81-0.89 of the time of raw
    ones, and the serial price stored raw."""
    raw, packed = (0.5e-9, 6e-9), (7e-9 + 0.68 * 0.5e-9, 0.68 * 6e-9)
    assert _policy(raw, packed, cores=2).decide().compress
    assert not _policy(raw, packed, cores=1).decide().compress  # one core: the CPU is the pace
    # Storage faster than the encoders: raw, however many cores.
    assert not _policy((0.5e-9, 1e-9), (5e-9, 0.68e-9), cores=4).decide().compress


def test_policy_for_gives_the_writer_threads_at_most_the_cores_there_are(monkeypatch):
    monkeypatch.setattr(adaptive, "usable_cores", lambda: 2)
    assert adaptive.policy_for(("memory", "adaptive-c"), 1, threads=8).cores == 2
    assert adaptive.policy_for(("memory", "adaptive-c"), 1, threads=1).cores == 1
    assert adaptive.usable_cores() >= 1


class FakeTime:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_overlapping_writes_and_syncs_share_the_time_they_spent_together():
    """Charged its whole wait, each of n in flight on one device would count its time n times."""
    now = FakeTime()
    clock = adaptive.DeviceClock(now)
    a = clock.start()  # t=0: a alone
    now.t = 1.0
    b = clock.start()  # t=1: a and b together
    now.t = 3.0
    share_a = clock.stop(a)  # a: 1 alone + 2 shared by two = 2
    now.t = 4.0
    share_b = clock.stop(b)  # b: 2 shared by two + 1 alone = 2
    assert share_a == pytest.approx(2.0) and share_b == pytest.approx(2.0)
    assert share_a + share_b == pytest.approx(4.0)  # the time anything was in flight
    now.t = 10.0  # idle time is nobody's
    c = clock.start()
    now.t = 10.5
    assert clock.stop(c) == pytest.approx(0.5)

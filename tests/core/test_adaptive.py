"""The adaptive codec's decision: a part is compressed only when that costs a writer thread
less, end to end, than storing it raw on this root (estimates measured per mode; compressing
measured on a sample of a part stored raw, so finding out costs little)."""

from __future__ import annotations

import numpy as np
import pytest

from ckptflow.core import adaptive, codec


def _policy(raw_s: float | None, packed_s: float | None, evidence: int = adaptive.MIN_EVIDENCE):
    def est(s):
        return adaptive.Estimate() if s is None else adaptive.Estimate(s, evidence)

    return adaptive.Policy(est(raw_s), est(packed_s))


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
    p.observe(False, adaptive.MIN_EVIDENCE // 2, 0.01)
    p.observe_sample(adaptive.MIN_EVIDENCE // 2, adaptive.SAMPLE, 1e-3, adaptive.SAMPLE // 2)
    assert p.decide() == adaptive.Decision(False, sample=True)  # half the evidence of each
    p.observe(False, adaptive.MIN_EVIDENCE // 2, 0.01)
    p.observe_sample(adaptive.MIN_EVIDENCE // 2, adaptive.SAMPLE, 1e-3, adaptive.SAMPLE // 2)
    assert p.raw.value(adaptive.MIN_EVIDENCE) and p.packed.value(adaptive.MIN_EVIDENCE)
    assert p.decide().sample is False  # decided now


def test_a_sample_stands_for_its_part_encoding_time_plus_the_raw_cost_of_what_it_stores():
    p = _policy(raw_s=None, packed_s=None)
    p.observe_sample(64 << 20, 1 << 20, 1e-3, 1 << 19)
    assert p.packed.value() is None  # nothing to weigh it against before raw is measured
    p.observe(False, 64 << 20, 64 * 0.004)  # raw: 4 ms per MiB
    p.observe_sample(64 << 20, 1 << 20, 0.001, 1 << 19)  # 1 ms per MiB, half the bytes left
    assert p.packed.evidence == 64 << 20
    assert abs(p.packed.value() * (1 << 20) - (0.001 + 0.004 / 2)) < 1e-9
    assert p.decide().compress  # 3 ms per MiB compressed beats 4 raw


def test_a_mode_that_becomes_cheaper_takes_over_through_exploration():
    p = _policy(raw_s=1e-9, packed_s=2e-9)  # raw wins today
    assert _choices(p, 15).count(True) == 0
    for _ in range(8):  # the disk slows down: explored compressed parts now cost less
        p.observe(False, 64 << 20, 0.64)  # 10 ns/B raw
        p.observe(True, 64 << 20, 0.128)  # 2 ns/B compressed
    assert _choices(p, 32).count(True) == 30


def test_estimates_are_weighted_by_bytes_and_kept_per_root_and_level():
    e = adaptive.Estimate()
    e.add(1 << 20, 1.0)  # ~1e-6 s/B
    first = e.value()
    e.add(1 << 30, 1.0)  # ~1e-9 s/B, and a large observation moves it most of the way
    assert 1.0 / (1 << 30) < e.value() < 0.25 * first
    a = adaptive.policy_for(("memory", "adaptive-a"), 1)
    b = adaptive.policy_for(("memory", "adaptive-b"), 1)
    a.observe(False, 64 << 20, 1.0)
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
        cost.thread(0.010, (1 << 20, 0.005, 1 << 19))

    def synced():
        cost.synced(0.030)

    first, second = (synced, thread) if sync_first else (thread, synced)
    first()
    assert p.raw.evidence == 0  # not observed on one half
    second()
    assert p.raw.s_per_byte == pytest.approx(0.040 / (1 << 20))
    # the sample: its encoding plus the raw cost (sync included) of half the bytes
    assert p.packed.s_per_byte == pytest.approx((0.005 + 0.020) / (1 << 20))
    assert p.raw.evidence == p.packed.evidence == 1 << 20

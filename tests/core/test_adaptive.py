"""The adaptive codec's decision: compress a plane only when it pays at the storage's speed."""

from __future__ import annotations

import numpy as np

from ckptflow.core import adaptive, codec


def _policy(store_s: float | None, compress_s: float, evidence: int = adaptive.MIN_EVIDENCE):
    store = adaptive.Estimate() if store_s is None else adaptive.Estimate(store_s, evidence)
    return adaptive.Policy(store, adaptive.Estimate(compress_s, 1 << 30))


def test_compression_pays_only_when_the_bytes_saved_outweigh_its_cost():
    slow_disk = _policy(store_s=10e-9, compress_s=1e-9)  # 0.1 GB/s per thread, 1 GB/s zstd
    fast_disk = _policy(store_s=0.5e-9, compress_s=1e-9)  # storage outruns the encoder
    assert slow_disk.pays(0.25) and not slow_disk.pays(0.95)
    assert not fast_disk.pays(0.25)


def test_without_enough_evidence_compressible_planes_are_compressed():
    assert _policy(store_s=None, compress_s=1.0).pays(0.5)
    assert _policy(store_s=1e-12, compress_s=1.0, evidence=1 << 10).pays(0.5)


def test_estimates_are_weighted_by_bytes_and_kept_per_root():
    e = adaptive.Estimate()
    e.add(1 << 20, 1.0)  # ~1e-6 s/B
    first = e.value()
    e.add(1 << 30, 1.0)  # ~1e-9 s/B, and a large observation moves it most of the way
    assert 1.0 / (1 << 30) < e.value() < 0.25 * first
    a = adaptive.policy_for(("memory", "adaptive-a"), 1)
    b = adaptive.policy_for(("memory", "adaptive-b"), 1)
    a.observe_store(64 << 20, 1.0)
    assert b.store.value() is None and a.store.value() is not None
    assert adaptive.policy_for(("memory", "adaptive-a"), 1).store is a.store


def _floats(n: int = 1 << 16) -> np.ndarray:
    return (np.random.default_rng(0).standard_normal(n) * 0.02).astype(np.float32).view(np.uint8)


def test_auto_stores_a_part_raw_and_ungrouped_when_nothing_pays():
    raw = _floats()
    enc = codec.encode(raw, 4, 1, "auto", _policy(store_s=1e-12, compress_s=1e-9))
    assert enc.planes == [["raw", len(raw)]]
    assert np.array_equal(codec.decode(enc.data, enc.planes, 4, len(raw)), raw)


def test_auto_compresses_the_planes_that_pay_and_forced_modes_ignore_the_policy():
    raw = _floats()
    slow = _policy(store_s=100e-9, compress_s=1e-9)
    auto = codec.encode(raw, 4, 1, "auto", slow)
    assert [c for c, _ in auto.planes] == ["raw", "raw", "raw", "zstd"]
    fast = _policy(store_s=1e-12, compress_s=1e-9)
    forced = codec.encode(raw, 4, 1, True, fast)
    assert [c for c, _ in forced.planes] == ["raw", "raw", "raw", "zstd"]
    assert codec.encode(raw, 4, 1, False, slow).planes == [["raw", len(raw)]]
    for enc in (auto, forced):
        assert np.array_equal(codec.decode(enc.data, enc.planes, 4, len(raw)), raw)


def test_encoding_teaches_the_policy_the_compression_speed():
    p = adaptive.Policy(adaptive.Estimate(), adaptive.Estimate())
    codec.encode(_floats(), 4, 1, "auto", p)
    assert p.compress.value() is not None and p.compress.evidence > 0

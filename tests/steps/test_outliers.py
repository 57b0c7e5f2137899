"""The slow-rank rule of preflight and straggler detection, on injected figures (no timing)."""

from __future__ import annotations

import math

import pytest
from ckptflow.steps.lib.outliers import StragglerTracker, ratios, slow_ranks


def test_a_rank_is_compared_with_its_peers_median_not_with_all_ranks():
    # two ranks, one four times slower: against the mean of both it would look 2.5x slower
    assert ratios([100.0, 25.0], higher_is_better=True) == [0.25, 4.0]
    assert ratios([0.01, 0.04], higher_is_better=False) == [0.25, 4.0]
    assert ratios([10.0, 10.0, 10.0, 2.0], higher_is_better=True) == [1.0, 1.0, 1.0, 5.0]


def test_a_rank_alone_and_failed_measurements():
    assert ratios([7.0], higher_is_better=True) == [1.0]
    assert ratios([10.0, 0.0], higher_is_better=True)[1] == math.inf  # nothing measured
    assert ratios([10.0, math.nan], higher_is_better=True)[1] == math.inf
    assert ratios([0.0, 0.0], higher_is_better=False) == [1.0, 1.0]


def test_slow_ranks_names_the_rank_and_the_figure_slowest_first():
    figures = {
        "matmul_gflops": [50.0, 12.0, 49.0],  # rank 1: 49.5 / 12 = 4.1x
        "store_write_mib_s": [800.0, 790.0, 200.0],  # rank 2: 795 / 200 = 4.0x
        "latency_us": [90.0, 100.0, 95.0],
    }
    higher = {"matmul_gflops": True, "store_write_mib_s": True, "latency_us": False}
    found = slow_ranks(figures, higher, factor=3.0)
    assert [(s.rank, s.metric) for s in found] == [(1, "matmul_gflops"), (2, "store_write_mib_s")]
    assert found[0].peers_median == pytest.approx(49.5)
    assert found[0].ratio == pytest.approx(49.5 / 12)
    assert slow_ranks(figures, higher, factor=5.0) == []


def test_a_straggler_is_persistent_after_consecutive_windows_and_reported_once():
    t = StragglerTracker(factor=2.0, windows=3)
    fast, slow = [0.01, 0.01, 0.01], [0.01, 0.05, 0.01]
    assert t.update(slow)[1] == []
    assert t.update(slow)[1] == []
    ratios_, new = t.update(slow)
    assert new == [1] and ratios_[1] == pytest.approx(5.0)
    assert t.update(slow)[1] == []  # reported once per streak
    assert t.update(fast)[1] == []  # the streak ends
    assert [t.update(slow)[1] for _ in range(3)] == [[], [], [1]]


def test_a_streak_broken_by_one_normal_window_starts_again():
    t = StragglerTracker(factor=2.0, windows=2)
    assert t.update([1.0, 3.0])[1] == []
    assert t.update([1.0, 1.5])[1] == []  # 1.5x: not slow enough
    assert t.update([1.0, 3.0])[1] == []
    assert t.update([1.0, 3.0])[1] == [1]


def test_bad_tracker_settings_are_refused():
    with pytest.raises(ValueError, match="at least 1"):
        StragglerTracker(factor=0.5, windows=3)
    with pytest.raises(ValueError, match="windows"):
        StragglerTracker(factor=2.0, windows=0)

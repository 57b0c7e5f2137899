"""The benchmark's schedule: which method runs after which, round by round."""

from __future__ import annotations

from benchmarks import checkpoint


def _plan() -> list:
    cfg = checkpoint.parse(["--repeats", "5"])
    return checkpoint.plan(cfg)


def test_every_round_runs_every_method_once():
    order = _plan()
    for rnd in range(5):
        got = checkpoint.round_order(order, rnd)
        assert sorted(got) == sorted(order) and len(got) == len(order)


def test_no_method_follows_the_same_one_in_every_round():
    """Rotated, every method kept its neighbours: the save after DCP's async_save (which leaves
    the disk busy) was ckptflow-sync's in every round, 0.15-0.2 s slower each time."""
    order = _plan()
    rounds = [checkpoint.round_order(order, rnd) for rnd in range(5)]
    for method in order:
        before = {r[r.index(method) - 1] if r.index(method) else None for r in rounds}
        assert len(before) > 1, (method, before)

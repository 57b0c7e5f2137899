"""Durability of a save's objects: each object's share of the sync time (SharedClock)."""

from __future__ import annotations

import pytest
from ckptflow.steps.checkpoint.durability import SharedClock


class FakeTime:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_overlapping_syncs_share_the_time_they_spent_together():
    """Charged its whole wait, each of n syncs on one device would count its time n times."""
    now = FakeTime()
    clock = SharedClock(now)
    a = clock.start()  # t=0: a alone
    now.t = 1.0
    b = clock.start()  # t=1: a and b together
    now.t = 3.0
    share_a = clock.stop(a)  # a: 1 alone + 2 shared by two = 2
    now.t = 4.0
    share_b = clock.stop(b)  # b: 2 shared by two + 1 alone = 2
    assert share_a == pytest.approx(2.0) and share_b == pytest.approx(2.0)
    assert share_a + share_b == pytest.approx(4.0)  # the time anything was syncing
    now.t = 10.0  # idle time is nobody's
    c = clock.start()
    now.t = 10.5
    assert clock.stop(c) == pytest.approx(0.5)

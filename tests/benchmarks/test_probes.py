"""Probes of the benchmark: waiting for the storage to settle before a timed phase."""

from __future__ import annotations

from benchmarks import probes


def test_settle_waits_for_a_quiet_storage_and_gives_up_at_its_limit(monkeypatch):
    busy = iter([True] * 5 + [False] * 1000)
    monkeypatch.setattr(probes, "storage_busy", lambda: next(busy))
    waited = probes.settle(quiet_s=0.05, limit_s=5)
    assert 0.05 <= waited < 2  # five busy polls, then quiet for 0.05 s
    monkeypatch.setattr(probes, "storage_busy", lambda: True)
    assert 0.2 <= probes.settle(quiet_s=0.05, limit_s=0.2) < 1.5  # never quiet: its limit


def test_the_storage_is_read_as_busy_or_not():
    assert probes.storage_busy(dirty_limit=1 << 62) in (True, False)
    assert probes.storage_busy(dirty_limit=-1) is True  # any dirty byte counts over -1

"""Each recovery's measured time (issue 34): rank 0's progress marks, the `recovery` event a
restarted training records after its first step, and `ckptflow ckpt stats` listing them."""

from __future__ import annotations

import json

from ckptflow.core import health, health_stats, liveness
from ckptflow.core.storage import Storage


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def train(st: Storage, clock: Clock, start: int, stop: int, step_s: float = 1.0) -> None:
    tracker = liveness.Tracker(st, start, clock=clock)
    for step in range(start + 1, stop + 1):
        clock.t += step_s
        tracker.progressed(step)


def test_a_restart_records_last_progress_to_first_progress_and_stats_list_it(tmp_path):
    st = Storage(str(tmp_path / "ckpt"))
    clock = Clock(1_000_000.0)
    train(st, clock, 0, 23)  # fails after step 23 (the mark: step 21, written at most every 5 s)
    mark = liveness.read(st)
    assert mark is not None and mark.step == 21 and mark.at == 1_000_021.0
    assert [e for e in health.read_events(st)[0] if e.kind == "recovery"] == []  # a fresh start
    clock.t += 100.0  # detection, rescheduling, rendezvous, load
    train(st, clock, 20, 25)  # resumed from the checkpoint of step 20
    (ev,) = [e for e in health.read_events(st)[0] if e.kind == "recovery"]
    assert (ev.step, ev.last_step) == (20, 21)
    assert ev.duration_s == 1_000_124.0 - 1_000_021.0  # 103 s: the first resumed step included
    out = health_stats.stats(st)["recoveries"]["measured"]
    assert out == [
        {
            "at": ev.at,
            "recovery_s": 103.0,
            "resumed_step": 20,
            "last_step": 21,
            "lost_steps": 1,
            "source": "",  # not told how the resume restored (issue 35)
            "store_bytes": 0,
        }
    ]
    text = health_stats.render(health_stats.stats(st))
    assert "recovery 1" in text and "1.72 min" in text or "103.00 s" in text
    train(st, clock, 25, 26)  # a second restart: a second record, the first one stays
    assert len(health_stats.stats(st)["recoveries"]["measured"]) == 2


def test_a_damaged_progress_file_costs_the_measurement_not_the_training(tmp_path, caplog):
    st = Storage(str(tmp_path / "ckpt"))
    for blob in (b"{not json", json.dumps({"step": -1, "at": 5.0}).encode(), b"x" * 10_000):
        st.write(liveness.PROGRESS, blob)
        assert liveness.read(st) is None
        train(st, Clock(2_000_000.0), 10, 12)  # trains on, writes a fresh mark
        assert liveness.read(st).step == 11
    assert not [e for e in health.read_events(st)[0] if e.kind == "recovery"]
    assert "recovery time not measured" in caplog.text


def test_a_recovery_event_with_a_hostile_last_step_is_counted_damaged(tmp_path):
    st = Storage(str(tmp_path / "ckpt"))
    doc = {"kind": "recovery", "at": 5.0, "step": 3, "last_step": -4}
    st.write(f"{health.EVENTS}/0000000005000000-recovery-0123abcd.json", json.dumps(doc).encode())
    events, damaged = health.read_events(st)
    assert (events, damaged) == ([], 1)

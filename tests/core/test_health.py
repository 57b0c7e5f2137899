"""The health event log (ckptflow.core.health) and `ckptflow ckpt stats` on real checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer

from ckptflow import cli
from ckptflow.core import health, health_stats, listing, runroot
from ckptflow.core.storage import Storage

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def test_events_round_trip_and_hostile_files_are_skipped_and_counted(tmp_path):
    st = Storage(str(tmp_path / "root"))
    health.record(st, "save", step=3, duration_s=1.5, stall_s=0.2, bytes=10, save_kind="full")
    health.record(st, "load", step=3, resume=True, fell_back=1)
    assert health.record(st, "nope") is None  # an unknown kind is refused, never raised
    assert health.record(st, "save", step=-1) is None
    hostile = {
        "a": b"{not json",
        "b": json.dumps({"kind": "save", "at": 1.0, "step": 2**70}).encode(),
        "c": json.dumps({"kind": "save", "at": 1.0, "stall_s": float("nan")}).encode(),
        "d": json.dumps({"kind": "load", "at": 1.0}).encode(),  # kind differs from its name
        "e": b" " * (health.MAX_EVENT + 1),
        "f": json.dumps({"kind": "save", "at": 1.0, "bytes": True}).encode(),
    }
    for i, blob in enumerate(hostile.values()):
        st.write(f"events/000000000000000{i}-save-0000000{i}.json", blob)
    st.write("events/notes.txt", b"ignored: not an event name")
    events, damaged = health.read_events(st)
    assert damaged == len(hostile)
    assert [(e.kind, e.step) for e in events] == [("save", 3), ("load", 3)]
    assert events[0].stall_s == 0.2 and events[1].resume and events[1].fell_back == 1
    assert len(health.prune(st, keep=2)) == len(hostile)
    assert health.read_events(st) == (events, 0)


def test_recording_never_fails_the_caller(tmp_path):
    class Broken(Storage):
        def write(self, *a, **kw):
            raise OSError("disk full")

    assert health.record(Broken(str(tmp_path)), "gc", bytes=1) is None


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(64, 64, generator=g)}, "step": seed}


def test_stats_of_a_root_with_saves_a_resume_a_verify_and_an_evaluation(tmp_path, capsys):
    uri = str(tmp_path / "ckpt")
    ck = Checkpointer(uri, full_every=2)
    for s in (1, 2, 3):
        ck.save(s, _state(s))
    ck.close()
    ck = Checkpointer(uri)
    assert ck.load(_state(0)) == 3  # a resume: the newest step
    ck.close()
    st = Storage(uri)
    rows = {r.step: r for r in listing.build_rows(st, now=1e10)}
    runroot.write_eval(
        st, runroot.EvalRecord(2, metrics={"val_loss": 1.0}, evaluated_at=rows[2].committed_at + 7)
    )
    assert cli.main(["ckpt", "verify", uri, "--step", "2"]) == 0
    capsys.readouterr()
    s = health_stats.stats(st)
    assert s["steps"]["committed"] == 3 and (s["steps"]["first"], s["steps"]["last"]) == (1, 3)
    assert s["saves"] == {"recorded": 3, "failed": 0, "success_rate": 1.0}
    assert s["stall_s"]["median"] > 0 and s["save_s"]["p95"] >= s["save_s"]["median"]
    times = [rows[i].committed_at for i in (1, 2, 3)]
    assert s["achieved_rpo_s"] == pytest.approx(max(times[1] - times[0], times[2] - times[1]))
    assert s["checkpoints_per_hour"] == pytest.approx(2 / ((times[2] - times[0]) / 3600))
    assert s["commit_to_evaluated_s"]["median"] == pytest.approx(7.0)
    assert s["last_verified_step"] == 2
    assert s["recoveries"]["count"] == 1 and s["recoveries"]["max_s"] >= 0
    assert set(s["bytes"]["new_by_kind"]) == {"full", "delta"}
    assert s["bytes"]["hot_unique"] == sum(e.size for e in listing.list_objects(st).values())
    assert cli.main(["ckpt", "stats", uri, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"]["committed"] == 3
    assert cli.main(["ckpt", "stats", uri]) == 0
    out = capsys.readouterr().out
    assert "achieved RPO (max gap)" in out and "last verified step      2" in out


def test_quantile_by_hand():
    assert health_stats.quantile([], 0.5) is None
    assert health_stats.quantile([3, 1, 2], 0.5) == 2
    assert health_stats.quantile(list(range(1, 101)), 0.95) == 95


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(None, "-"), (0.0, "0 ms"), (0.00042, "0.42 ms"), (0.0123, "12.3 ms"), (0.5, "500 ms")]
    + [(1.5, "1.50 s"), (42.0, "42.00 s")],
)
def test_durations_under_a_second_show_in_milliseconds(seconds, shown):
    """A sub-millisecond stall printed as "0.00 s" says nothing (issue 38, point 10)."""
    assert health_stats.duration(seconds) == shown


def test_stats_table_shows_a_short_stall_in_milliseconds(tmp_path, capsys):
    uri = str(tmp_path / "ckpt")
    ck = Checkpointer(uri)
    ck.save(1, _state(1))
    ck.close()
    assert cli.main(["ckpt", "stats", uri]) == 0
    line = next(s for s in capsys.readouterr().out.splitlines() if s.startswith("stall"))
    assert line.endswith(" ms") and "0.00 s" not in line, line

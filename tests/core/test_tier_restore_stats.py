"""Recoveries by source (issue 35): the `recovery` event carries where the restore loaded from
(local | peer | store) and the bytes it read from object storage; `ckptflow ckpt stats`
counts recoveries by source and sums those bytes (JSON and text)."""

from __future__ import annotations

import json

import pytest

from ckptflow import cli
from ckptflow.core import health, health_stats, liveness
from ckptflow.core.storage import Storage
from tests.core.test_liveness import Clock


def _recover(st: Storage, clock: Clock, start: int, source: str, store_bytes: int) -> None:
    tracker = liveness.Tracker(st, start, clock=clock, source=source, store_bytes=store_bytes)
    for step in range(start + 1, start + 3):
        clock.t += 6.0
        tracker.progressed(step)


def test_recoveries_by_source_and_bytes_from_object_storage(tmp_path, capsys):
    st = Storage(str(tmp_path / "ckpt"))
    clock = Clock(1_000_000.0)
    _recover(st, clock, 0, "", 0)  # a fresh start: no recovery
    _recover(st, clock, 5, "local", 7_000)
    _recover(st, clock, 7, "peer", 9_000)
    _recover(st, clock, 9, "store", 3 << 20)
    _recover(st, clock, 11, "local", 1_000)
    rec = health_stats.stats(st)["recoveries"]
    assert rec["by_source"] == {"local": 2, "peer": 1, "store": 1}
    assert rec["store_bytes"] == 7_000 + 9_000 + (3 << 20) + 1_000
    assert [(m["source"], m["store_bytes"]) for m in rec["measured"]] == [
        ("local", 7_000), ("peer", 9_000), ("store", 3 << 20), ("local", 1_000)
    ]  # fmt: skip
    assert cli.main(["ckpt", "stats", st.uri, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["recoveries"]
    assert out["by_source"] == {"local": 2, "peer": 1, "store": 1}
    assert out["store_bytes"] == rec["store_bytes"]
    assert cli.main(["ckpt", "stats", st.uri]) == 0
    text = capsys.readouterr().out
    assert "recoveries by source" in text and "local 2, peer 1, store 1" in text
    assert "3.0 MiB from object storage" in text
    assert "from store" in text and "from local" in text


def test_a_recovery_without_a_source_counts_in_no_source(tmp_path):
    """Events written before issue 35 (or by a step without a local tier) carry no source."""
    st = Storage(str(tmp_path / "ckpt"))
    doc = {"kind": "recovery", "at": 5.0, "step": 3, "last_step": 4, "duration_s": 2.0}
    st.write(f"{health.EVENTS}/0000000005000000-recovery-0123abcd.json", json.dumps(doc).encode())
    rec = health_stats.stats(st)["recoveries"]
    assert rec["by_source"] == {"local": 0, "peer": 0, "store": 0}
    assert rec["store_bytes"] == 0 and rec["measured"][0]["source"] == ""


@pytest.mark.parametrize(
    "bad", [{"source": "nfs"}, {"source": 3}, {"store_bytes": -1}, {"store_bytes": 1.5}]
)
def test_a_recovery_event_with_a_hostile_source_or_bytes_is_counted_damaged(tmp_path, bad):
    st = Storage(str(tmp_path / "ckpt"))
    doc = {"kind": "recovery", "at": 5.0, "step": 3, "last_step": 4, **bad}
    st.write(f"{health.EVENTS}/0000000005000000-recovery-0123abcd.json", json.dumps(doc).encode())
    assert health.read_events(st) == ([], 1)

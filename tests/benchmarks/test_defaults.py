"""benchmarks/defaults.py's report: paired ratios, targets, per-repeat ratios and host load
(no child processes spawned)."""

from __future__ import annotations

from benchmarks import defaults


def _rows(first_stalls: list[tuple[float, float]], load: float) -> dict:
    rows: dict = {m: [] for m in defaults.METHODS}
    for ck_first, dcp_first in first_stalls:
        rows["ckptflow-sync"].append(
            {"save_s": 0.7, "stored_raw": 0.82, "mode": "auto:adaptive", "load": load}
        )
        rows["dcp-sync"].append({"save_s": 1.0, "load": load + 1})
        rows["dcp-sync-2t"].append({"save_s": 1.4, "load": load})
        rows["ckptflow-async"].append(
            {
                "first_stall_s": ck_first,
                "first_total_s": 1.0,
                "steady_stall_s": 0.1,
                "steady_total_s": 1.0,
                "load": load,
            }
        )
        rows["dcp-async"].append(
            {
                "first_stall_s": dcp_first,
                "first_total_s": 2.0,
                "steady_stall_s": 0.5,
                "steady_total_s": 2.0,
                "load": load,
            }
        )
    return rows


def test_the_report_pairs_repeats_and_shows_each_ratio_and_the_load():
    rows = _rows([(0.4, 0.5), (0.9, 0.5), (0.3, 0.5)], load=12.0)
    text = defaults.report(rows, [], 512, 3, "--mib 512 --repeats 3")
    assert "| sync save, fresh Checkpointer / DCP | 0.700 | 0.8 | pass |" in text
    # the median of the per-repeat ratios (0.8, 1.8, 0.6), not the ratio of the medians
    assert "| first async stall, fresh Checkpointer / DCP async_save | 0.800 | 1.0 | pass |" in text
    assert "- first stall / DCP: 0.80 1.80 0.60" in text
    assert "- sync save / DCP: 0.70 0.70 0.70" in text
    assert "(1-minute load 12.0-13.0 over the runs)" in text


def test_a_missed_target_is_marked():
    text = defaults.report(_rows([(0.6, 0.5)] * 3, load=1.0), [], 512, 3, "")
    assert (
        "| first async stall, fresh Checkpointer / DCP async_save | 1.200 | 1.0 | **miss** |"
        in text
    )

"""benchmarks/scale.py's report: request summaries and the docs section (no ranks spawned)."""

from __future__ import annotations

from collections import Counter

from benchmarks import scale, scale_report
from benchmarks.s3_requests import Counts, kind_of, rank_key


def test_requests_are_counted_per_rank_and_phase_and_summarized():
    counts = Counts()
    for rank in (0, 1, 2):
        counts.add(rank_key(rank, "load"), kind_of("GET", "/b/ckpt/objects/ab/abcd", ""))
    counts.add(rank_key(0, "load"), kind_of("GET", "/b", "list-type=2&prefix=ckpt%2F"))
    counts.add(rank_key(1, "save"), "PUT")
    counts.add("someone-else", "PUT")
    got = counts.take()
    assert got[("load", 0)] == Counter(GET=1, LIST=1) and got[("save", 1)] == Counter(PUT=1)
    assert counts.take() == {}
    (row,) = scale.summarize_requests([{"world": 3, "tensors": 2, "counts": got}])
    assert row["load"]["rank0"] == 2 and row["load"]["others_max"] == 1
    assert row["save"]["others_min"] == 0 and row["save"]["others_max"] == 1


def test_the_section_shows_the_ratios_and_the_before_column():
    timing = [
        {
            "world": 4,
            "tensors": 200,
            "numel": 16384,
            "manifests": "auto",
            "written": "rank",
            "median_s": {"ckptflow-save": 1, "dcp-save": 2, "ckptflow-load": 1, "dcp-load": 1},
            "ratio": {"save": 0.5, "load": 1.0},
        }
    ]
    before = [{"world": 4, "tensors": 200, "save": 0.92, "load": 0.53}]
    text = scale_report.markdown(timing, [], before, "Host: test.")
    assert text.startswith(scale_report.BEGIN) and text.endswith(scale_report.END)
    assert "| 4 × 200 | auto: rank | 0.50 | 1.00 | 1.00, 2.00 | 1.00, 1.00 | 0.92, 0.53 |" in text


def test_each_manifests_option_is_timed_and_names_what_it_wrote(tmp_path):
    """Two ranks, one round: the row says which format the saves wrote (read from the root)."""
    for mode in ("rank", "step"):
        row = scale.run_shape(2, 3, 64, 1, str(tmp_path), manifests=mode)
        assert row["manifests"] == mode and row["written"] == mode
        assert set(row["median_s"]) == {"ckptflow-save", "dcp-save", "ckptflow-load", "dcp-load"}
        assert all(t > 0 for t in row["median_s"].values())

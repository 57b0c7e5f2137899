"""Step plumbing: Argo output files."""

from __future__ import annotations

from ckptflow.steps.lib import plumbing


def test_write_outputs(tmp_path):
    plumbing.write_outputs(str(tmp_path / "o"), {"run_id": "abc", "evaluated": [1, 2]})
    assert (tmp_path / "o" / "run_id").read_text() == "abc"
    assert (tmp_path / "o" / "evaluated").read_text() == "[1, 2]"
    plumbing.write_outputs("", {"x": 1})  # no --output-dir: nothing to do

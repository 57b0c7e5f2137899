"""benchmarks/tier_peers.py runs end to end on a tiny piece and cleans up after itself."""

from __future__ import annotations

from benchmarks import tier_peers


def test_the_benchmark_pushes_and_fetches_and_leaves_nothing(tmp_path, capsys):
    assert tier_peers.main(["--mib", "1", "--repeats", "1", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "push:" in out and "push again:" in out and "fetch:" in out and "MB/s" in out
    assert list(tmp_path.iterdir()) == []

"""benchmarks/tier_restore.py runs end to end on a tiny state (2 gloo ranks, no S3) and
cleans up after itself; local and peer restores read nothing from the durable root."""

from __future__ import annotations

from benchmarks import tier_restore


def test_the_benchmark_restores_from_each_source_and_leaves_nothing(tmp_path, capsys):
    argv = ["--mib", "16", "--repeats", "1", "--no-s3", "--dir", str(tmp_path)]
    assert tier_restore.main(argv) == 0
    out = capsys.readouterr().out
    rows = {
        ln.split("|")[1].strip(): ln.split("|")[4].strip()
        for ln in out.splitlines()
        if ln.startswith("| ") and "source" not in ln
    }
    assert set(rows) == {"local", "peer", "store (disk)"}
    assert rows["local"] == rows["peer"] == "0"
    assert int(rows["store (disk)"].replace(",", "")) >= 16 << 20
    assert list(tmp_path.iterdir()) == []

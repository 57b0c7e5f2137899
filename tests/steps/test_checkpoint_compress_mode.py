"""`compress="auto"` weighs what stored bytes cost (issue 36): on object storage, billed by the
byte, it compresses every part; on a local disk it may store raw where that is faster. The
mode each save used is recorded in its manifest and shown by `ckpt ls` and `ckpt stats`."""

from __future__ import annotations

import json

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer

from ckptflow import ckpt_cli
from ckptflow.core import adaptive, codec, layout, rootreader
from ckptflow.core import manifest as mf
from ckptflow.core.storage import Storage

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


W_BYTES = 512 * 1024 * 4


def _state() -> dict:
    g = torch.Generator().manual_seed(3)
    # 2 MiB of fp32 (a part large enough to be measured) and a small tensor (packed)
    return {"w": torch.randn(512, 1024, generator=g), "b": torch.randn(64, generator=g)}


def _compression(root: str, step: int) -> dict:
    return rootreader.read_manifest(Storage(root), step)["stats"]["compression"]


@pytest.mark.parametrize(
    ("protocol", "rule"),
    [("s3", "always"), ("gs", "always"), ("az", "always"), ("file", "adaptive")]
    + [("memory", "adaptive")],
)
def test_auto_rule_compresses_always_where_stored_bytes_are_billed(protocol, rule):
    assert adaptive.auto_rule(protocol) == rule
    policy = adaptive.policy_for((protocol, "bucket", f"rule-{protocol}"), 1)
    assert policy.always is (rule == "always")
    if rule == "always":  # no estimates needed, no sample encoded: every part compressed
        assert policy.decide() == adaptive.Decision(True) and policy.favoured()
        assert adaptive.mode("auto", policy) == "auto:always"
    else:  # nothing measured yet: raw first, compressing measured on a sample of it
        assert policy.decide() == adaptive.Decision(False, sample=True)
        assert adaptive.mode("auto", policy) == "auto:adaptive"
    assert adaptive.mode(True, None) == "on" and adaptive.mode(False, None) == "off"


@pytest.mark.s3
def test_defaults_on_s3_compress_every_part_and_say_so(s3_bucket, capsys):
    root = f"s3://{s3_bucket}/ckpt"
    state = _state()
    Checkpointer(root).save(1, state)
    m = rootreader.read_manifest(Storage(root), 1)
    comp = m["stats"]["compression"]
    assert comp["mode"] == "auto:always" and comp["compressed_bytes"] >= W_BYTES
    # every part of `w` compressed (the encoder may still keep a plane that does not shrink
    # raw: `b` is 256 bytes); a fresh process's time-only rule stored the first parts raw
    parts = [p for key, it in m["items"].items() if key.startswith("w@") for p in it["parts"]]
    assert parts and all(any(c != "raw" for c, _ in p["planes"]) for p in parts)
    assert m["stats"]["stored_bytes"] < m["stats"]["raw_bytes"]
    assert ckpt_cli.main(["ls", root]) == 0
    out = capsys.readouterr().out
    assert "COMPRESSED" in out.splitlines()[0] and "auto:always/100%" in out


def test_defaults_on_local_disk_are_adaptive_and_forced_modes_are_recorded(tmp_path, capsys):
    root = str(tmp_path / "ckpt")
    state = _state()
    Checkpointer(root).save(1, state)
    Checkpointer(root, compress=False).save(2, state)
    Checkpointer(root, compress=True).save(3, {k: v + 1 for k, v in state.items()})
    raw = rootreader.read_manifest(Storage(root), 1)["stats"]["raw_bytes"]
    assert _compression(root, 1)["mode"] == "auto:adaptive"
    assert 0 <= _compression(root, 1)["compressed_bytes"] <= raw
    assert _compression(root, 2) == {"mode": "off", "compressed_bytes": 0}
    assert _compression(root, 3)["mode"] == "on"
    assert W_BYTES <= _compression(root, 3)["compressed_bytes"] <= raw

    assert ckpt_cli.main(["ls", root, "--json"]) == 0
    rows = {r["step"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[2]["compression"] == "off" and rows[2]["compressed_share"] == 0.0
    assert rows[3]["compression"] == "on" and rows[3]["compressed_share"] > 0.99
    assert ckpt_cli.main(["ls", root]) == 0
    lines = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()[1:]}
    assert "off/0%" in lines["2"] and "on/100%" in lines["3"] and "auto:adaptive/" in lines["1"]

    assert ckpt_cli.main(["stats", root]) == 0
    text = capsys.readouterr().out
    row = next(ln for ln in text.splitlines() if ln.startswith("compression"))
    assert "auto:adaptive 1 step" in row and "off 1 step (0% of" in row
    assert "on 1 step (100% of" in row
    assert ckpt_cli.main(["stats", root, "--json"]) == 0
    comp = json.loads(capsys.readouterr().out)["bytes"]["compression"]
    assert comp["on"] == {
        "steps": 1,
        "logical_bytes": raw,
        "compressed_bytes": _compression(root, 3)["compressed_bytes"],
    }


def test_a_manifest_from_before_the_mode_was_recorded_lists_as_unrecorded(tmp_path, capsys):
    root = str(tmp_path / "ckpt")
    Checkpointer(root).save(1, _state())
    st = Storage(root)
    commit = rootreader.read_commit(st, 1)
    m = rootreader.read_manifest(st, 1)
    del m["stats"]["compression"]  # as a save before issue 36 wrote it
    assert mf.validate(m) is m  # still valid
    blob = mf.dumps(m)
    st.write(f"{layout.step_dir(1)}/{commit['manifest']}", blob)
    commit["manifest_xxh3"] = codec.digest(blob)
    st.write(layout.commit_path(1), json.dumps(commit).encode())
    assert ckpt_cli.main(["ls", root, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    assert row["state"] == "committed" and row["compression"] is None
    assert row["compressed_share"] is None
    assert ckpt_cli.main(["ls", root]) == 0
    head, line = capsys.readouterr().out.splitlines()[:2]
    assert line[head.index("COMPRESSED") :].split()[0] == "-"
    assert ckpt_cli.main(["stats", root]) == 0
    assert "unrecorded 1 step" in capsys.readouterr().out


@pytest.mark.parametrize(
    "bad", [{"mode": "zip", "compressed_bytes": 0}, {"mode": "on"}, "on", {"mode": None}]
)
def test_a_damaged_compression_record_is_refused(tmp_path, bad):
    root = str(tmp_path / "ckpt")
    Checkpointer(root).save(1, _state())
    m = rootreader.read_manifest(Storage(root), 1)
    m["stats"]["compression"] = bad
    with pytest.raises(mf.ManifestError, match="stats.compression"):
        mf.validate(m)

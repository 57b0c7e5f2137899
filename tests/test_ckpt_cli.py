"""`ckptflow ckpt` ls / verify / pin / unpin / gc on real checkpoints, local and in-process S3."""

from __future__ import annotations

import json
import os

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer

from ckptflow.ckpt_cli import main
from ckptflow.core import layout, rootreader, runroot
from ckptflow.core.storage import Storage

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 64, generator=g), "b": torch.randn(64, generator=g)}


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def build_root(root: str) -> dict[int, dict]:
    """Steps 1 full, 2 delta of 1, 5 full, 6 the same content again (deduplicated), and an
    uncommitted leftover at step 9 (a save that crashed before its manifest)."""
    states = {s: state(s) for s in (1, 2, 5)}
    ck = Checkpointer(root, full_every=3)
    ck.save(1, states[1])
    ck.save(2, states[2])
    ck = Checkpointer(root, full_every=1)
    ck.save(5, states[5])
    ck.save(6, states[5])

    class Crash(Storage):
        def write(self, rel, data, *, exclusive=False, **kw):
            if "/manifest-" in rel:
                raise OSError("node lost")
            super().write(rel, data, exclusive=exclusive, **kw)

    with pytest.raises(OSError):
        Checkpointer(root, storage=Crash(root)).save(9, state(9))
    return states


def write_eval(st: Storage, step: int, metrics: dict) -> None:
    doc = {
        "step": step,
        "metrics": metrics,
        "evaluated_at": 1.0,
        "evaluator": "ckptflow.steps.evaluate",
    }
    st.write(runroot.eval_path(step), json.dumps(doc).encode())


def unique_object(root: str, step: int, others) -> str:
    st = Storage(root)
    mine = set(rootreader.read_manifest(st, step)["objects"])
    for o in others:
        mine -= set(rootreader.read_manifest(st, o)["objects"])
    return sorted(mine)[0]


def test_ls_shows_kind_sizes_state_pin_tier_and_metrics(tmp_path, capsys):
    root = str(tmp_path / "ckpt")
    build_root(root)
    write_eval(Storage(root), 2, {"val_loss": 1.25, "val_exact_match": 0.5})
    assert run(capsys, "pin", root, 1, "--reason", "published v1")[0] == 0
    rc, out, _ = run(capsys, "ls", root, "--json")
    assert rc == 0
    rows = {r["step"]: r for r in json.loads(out)}
    assert sorted(rows) == [1, 2, 5, 6, 9]
    assert [rows[s]["kind"] for s in (1, 2, 5, 6)] == ["full", "delta", "full", "deduplicated"]
    assert rows[2]["base_step"] == 1 and rows[6]["new_bytes"] < rows[6]["stored_bytes"] / 2
    assert all(rows[s]["state"] == "committed" for s in (1, 2, 5, 6))
    assert rows[9]["state"] == "uncommitted" and rows[9]["kind"] is None
    assert rows[1]["pinned"] and rows[1]["pin_reason"] == "published v1" and not rows[2]["pinned"]
    assert rows[2]["metrics"] == {"val_loss": 1.25, "val_exact_match": 0.5}
    m = rootreader.read_manifest(Storage(root), 2)
    assert rows[2]["logical_bytes"] == m["stats"]["raw_bytes"] == 64 * 64 * 4 + 64 * 4
    assert rows[2]["stored_bytes"] == m["stats"]["stored_bytes"]
    assert rows[2]["ratio"] == pytest.approx(rows[2]["logical_bytes"] / rows[2]["stored_bytes"])
    assert {r["tier"] for r in rows.values()} == {"hot"}
    rc, out, _ = run(capsys, "ls", root)
    lines = out.splitlines()
    assert rc == 0 and lines[0].split() == [
        "STEP", "STATE", "AGE", "KIND", "LOGICAL", "STORED", "NEW", "RATIO", "COMPRESSED", "PIN",
        "TIER", "METRICS",
    ]  # fmt: skip
    by_step = {line.split()[0]: line for line in lines[1:]}
    assert "delta<1" in by_step["2"] and "val_loss=1.25" in by_step["2"]
    assert "pinned" in by_step["1"] and "deduplicated" in by_step["6"]
    assert "uncommitted" in by_step["9"]


def test_damaged_eval_and_pin_files_cost_only_their_metrics_and_reason(tmp_path, capsys):
    """A hostile eval.json or PIN never breaks the listing: the step stays committed, the
    metrics and pin reason are left out, the other steps' records are shown."""
    root = str(tmp_path / "ckpt")
    build_root(root)
    st = Storage(root)
    write_eval(st, 1, {"val_loss": 2.5})
    st.write(
        runroot.eval_path(2), b'{"step": 2, "metrics": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    )
    st.write(runroot.eval_path(5), b'{"step": 5, "metrics": {"val_loss": "low"}}')
    st.write(runroot.pin_path(6), b'{"reason": {"nested": ["x"]}}')
    rc, out, err = run(capsys, "ls", root, "--json")
    rows = {r["step"]: r for r in json.loads(out)}
    assert rc == 0 and err == ""
    assert rows[1]["metrics"] == {"val_loss": 2.5}
    assert rows[2]["metrics"] == rows[5]["metrics"] == {}
    assert rows[6]["pinned"] and rows[6]["pin_reason"] is None
    assert all(rows[s]["state"] == "committed" for s in (1, 2, 5, 6))


def test_corrupt_object_is_named_by_verify_and_ls(tmp_path, capsys):
    root = str(tmp_path / "ckpt")
    build_root(root)
    assert run(capsys, "verify", root)[0] == 0
    key = unique_object(root, 2, [1, 5, 6])
    path = os.path.join(root, layout.object_path(key))
    with open(path, "r+b") as f:  # flip one byte: same size, wrong content
        f.seek(10)
        b = f.read(1)
        f.seek(10)
        f.write(bytes([b[0] ^ 0xFF]))
    rc, out, _ = run(capsys, "verify", root, "--all")
    assert rc == 1
    assert "step 2: CORRUPT" in out and f"bad file {path} (checksum mismatch)" in out
    assert "step 1: ok" in out and "step 6: ok" in out and "1 corrupt" in out
    assert run(capsys, "verify", root, "--step", 5)[0] == 0
    assert run(capsys, "verify", root, "--step", 2)[0] == 1
    # ls checks only sizes unless asked to read every byte
    rows = {r["step"]: r for r in json.loads(run(capsys, "ls", root, "--json")[1])}
    assert rows[2]["state"] == "committed"
    rows = {r["step"]: r for r in json.loads(run(capsys, "ls", root, "--json", "--verify")[1])}
    assert rows[2]["state"] == "corrupt" and rows[2]["problems"] == [f"{path} (checksum mismatch)"]
    assert rows[1]["state"] == rows[5]["state"] == "committed"
    rc, out, err = run(capsys, "ls", root, "--verify")  # found bad data: exit 1, as verify
    assert rc == 1 and "1 corrupt step(s): 2" in err
    # a missing object is found by the plain listing
    gone = unique_object(root, 5, [1, 2])
    os.remove(os.path.join(root, layout.object_path(gone)))
    rc, out, _ = run(capsys, "ls", root)
    assert (
        rc == 0
        and f"step 5: bad file {os.path.join(root, layout.object_path(gone))} (missing)" in out
    )
    assert [ln for ln in out.splitlines() if ln.startswith("5 ")][0].split()[1] == "corrupt"


def test_pin_unpin_round_trip(tmp_path, capsys):
    root = str(tmp_path / "ckpt")
    build_root(root)
    rc, out, _ = run(capsys, "pin", root, 2, "--reason", "release candidate")
    assert rc == 0 and "pinned step 2 (release candidate)" in out
    pin = json.loads(Storage(root).read(runroot.pin_path(2)))
    assert pin["reason"] == "release candidate" and pin["pinned_at"] > 0
    rc, out, _ = run(capsys, "gc", root, "--policy", "last=1", "--grace", "0", "--yes")
    assert rc == 0 and rootreader.committed_steps(Storage(root)) == [1, 2, 6]
    assert run(capsys, "unpin", root, 2)[0] == 0
    rc, out, _ = run(capsys, "unpin", root, 2)
    assert rc == 0 and "was not pinned" in out
    assert run(capsys, "gc", root, "--policy", "last=1", "--grace", "0", "--yes")[0] == 0
    assert rootreader.committed_steps(Storage(root)) == [6]


def test_gc_prints_a_dry_run_and_deletes_only_with_yes(tmp_path, capsys):
    root = str(tmp_path / "ckpt")
    states = build_root(root)
    rc, out, _ = run(capsys, "gc", root, "--policy", "last=1", "--grace", "0")
    assert rc == 0 and "would delete step" in out and "add --yes" in out
    assert rootreader.committed_steps(Storage(root)) == [1, 2, 5, 6]
    rc, out, _ = run(capsys, "gc", root, "--policy", "last=1", "--grace", "0", "--yes", "--json")
    report = json.loads(out)
    assert rc == 0 and report["applied"] and report["delete_steps"] == [1, 2, 5]
    assert report["leftovers"] == [9] and report["bytes_freed"] > 0
    assert report["keep"] == {"6": ["last-1", "latest-valid"]}
    assert report["grace_objects"] == 0 and report["grace_s"] == 0
    assert rootreader.step_names(Storage(root)) == {6: "step-00000006"}
    target = {"w": torch.zeros(64, 64), "b": torch.zeros(64)}
    Checkpointer(root).load(target)
    assert torch.equal(target["w"], states[5]["w"])


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["ls", "{tmp}/nothing"], "no checkpoints there; check the root URI"),
        (["ls", "{foreign}"], "holds something else"),
        (["ls", "ftp://host/x"], "unsupported storage URI"),
        (["verify", "{root}", "--step", "7"], "step 7 is not a committed checkpoint"),
        (["pin", "{root}", "4"], "committed steps: [1, 2, 5, 6]"),
        (["gc", "{root}", "--policy", "keep=3"], "unknown policy item 'keep'"),
        (["gc", "{root}", "--policy", "last=1", "--grace", "soon"], "bad duration 'soon'"),
        (["archive", "{root}", "--older-than", "7d", "--to", "{root}"], "is the hot root itself"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(tmp_path, capsys, argv, expect):
    root = str(tmp_path / "ckpt")
    build_root(root)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not a checkpoint")
    argv = [a.format(tmp=tmp_path, root=root, foreign=foreign) for a in argv]
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and expect in err and "Traceback" not in err + out


@pytest.mark.s3
def test_ls_verify_gc_on_s3_and_a_missing_bucket(s3_bucket, capsys):
    root = f"s3://{s3_bucket}/run/ckpt"
    states = build_root(root)
    rc, out, _ = run(capsys, "ls", root, "--json")
    rows = {r["step"]: r for r in json.loads(out)}
    assert rc == 0 and rows[2]["kind"] == "delta" and rows[9]["state"] == "uncommitted"
    assert run(capsys, "verify", root)[0] == 0
    rc, out, _ = run(capsys, "gc", root, "--policy", "last=1", "--grace", "0", "--yes")
    assert rc == 0 and rootreader.committed_steps(Storage(root)) == [6]
    target = {"w": torch.zeros(64, 64), "b": torch.zeros(64)}
    assert Checkpointer(root).load(target) == 6 and torch.equal(target["b"], states[5]["b"])
    rc, out, err = run(capsys, "ls", f"s3://{s3_bucket}-missing/ckpt")
    assert rc == 2 and "bucket does not exist" in err and "Traceback" not in err


def test_gc_says_what_the_grace_period_kept(tmp_path, capsys):
    root = str(tmp_path / "ckpt")
    build_root(root)
    rc, out, _ = run(capsys, "gc", root, "--policy", "last=1", "--grace", "1h")
    assert rc == 0
    line = next(ln for ln in out.splitlines() if ln.startswith("kept by the 1h grace period"))
    assert "unreferenced object(s)" in line and "--grace 0 frees them" in line
    report = json.loads(run(capsys, "gc", root, "--policy", "last=1", "--grace", "1h", "--json")[1])
    assert report["grace_objects"] > 0 and report["grace_bytes"] > 0 and report["grace_s"] == 3600
    assert report["grace_bytes"] >= report["bytes_freed"]  # what was freed is the smaller part


def test_ls_of_a_malformed_s3_uri_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    """`ckpt ls s3:/` was read as a local path named `s3:` (issue 37): one line, exit 2, and
    no folder of that name is made or read."""
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, "ls", "s3:/")
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "malformed storage URI 's3:/'" in err and "s3://" in err
    assert not (tmp_path / "s3:").exists()

"""The archive tier on real checkpoints: copy, verify, mark, free hot objects, load via the hot root."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer, CorruptCheckpoint

import ckptflow.core.localfs as localfs
from ckptflow.ckpt_cli import main
from ckptflow.core import layout, listing, rootreader
from ckptflow.core.archive import archive
from ckptflow.core.gc import gc
from ckptflow.core.storage import Storage

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def state(seed: int) -> dict:
    """Weights a small step apart from one seed to the next (so deltas pay: a tensor whose
    delta does not is stored full), a frozen tensor, and the step."""
    w = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    w += 1e-4 * torch.randn(64, 64, generator=torch.Generator().manual_seed(seed))
    return {"w": w, "frozen": torch.ones(16, 16), "step": seed}


def save_steps(root: str, steps, full_every: int = 3) -> dict[int, dict]:
    ck = Checkpointer(root, full_every=full_every)
    out = {s: state(s) for s in steps}
    for s in steps:
        ck.save(s, out[s])
    return out


def assert_loads(root: str, step: int, expected: dict) -> None:
    target = {"w": torch.zeros(64, 64), "frozen": torch.zeros(16, 16), "step": -1}
    ck = Checkpointer(root)
    assert ck.load(target, step=step) == step
    ck.verify(step)
    assert torch.equal(target["w"], expected["w"]) and target["step"] == expected["step"]


def rows_of(root: str) -> dict[int, listing.StepRow]:
    return {r.step: r for r in listing.build_rows(Storage(root), now=time.time())}


def test_archive_then_load_from_the_hot_root(tmp_path, capsys):
    root, arch = str(tmp_path / "hot"), str(tmp_path / "archive")
    states = save_steps(root, range(1, 8))  # 1 4 7 full; 2 3 5 6 deltas
    hot_before = listing.list_objects(Storage(root))
    report = archive(root, arch, 5.0, apply=True, now=time.time() + 10, grace_s=0)
    assert report.steps == [1, 2, 3, 4, 5, 6]  # all but the latest valid
    rows = rows_of(root)
    assert [rows[s].tier for s in range(1, 8)] == ["archive"] * 6 + ["hot"]
    assert all(rows[s].state == "committed" for s in rows) and rows[5].archive_uri == arch
    # the hot folder keeps what lists it; its data moved
    assert {"COMMIT", layout.ARCHIVED} <= set(os.listdir(os.path.join(root, "step-00000005")))
    hot_after = listing.list_objects(Storage(root))
    assert set(hot_after) == set(rootreader.read_manifest(Storage(root), 7)["objects"])
    assert report.bytes_freed == sum(e.size for k, e in hot_before.items() if k not in hot_after)
    marker = json.loads(Storage(arch).read(layout.ROOT_MARKER))
    assert marker["root_id"] == rootreader.read_root_id(Storage(root))
    for step in (1, 2, 5, 6, 7):
        assert_loads(root, step, states[step])
    capsys.readouterr()
    assert (
        main(["verify", root]) == 0 and "7 step(s) verified: all sound" in capsys.readouterr().out
    )
    # GC never deletes archived steps, and a second archive run has nothing left to do
    assert gc(root, "last=1", apply=True, grace_s=0).delete_steps == []
    assert archive(root, arch, 5.0, apply=True, now=time.time() + 10).steps == []
    assert_loads(root, 2, states[2])


def test_a_delta_archived_alone_is_self_contained_and_its_hot_base_stays(tmp_path):
    root, arch = str(tmp_path / "hot"), str(tmp_path / "archive")
    states = save_steps(root, range(1, 5))  # 1 full, 2 3 deltas of 1, 4 full
    rows = rows_of(root)
    now = rows[3].committed_at  # steps 1 and 2 are older than 0.001 s, step 3 is not
    report = archive(root, arch, 0.001, apply=True, now=now, grace_s=0)
    assert report.steps == [2]  # step 1 is the base of step 3, which stays hot
    rows = rows_of(root)
    assert (rows[1].tier, rows[2].tier, rows[3].tier) == ("hot", "archive", "hot")
    m2 = Checkpointer(root).manifest(2)  # (read from the archive)
    base_objects = {
        p["base"]["object"]
        for it in m2["items"].values()
        for p in it["parts"]
        if p["base"] is not None
    }
    assert base_objects, "step 2 is a delta of step 1"
    assert base_objects <= set(rootreader.read_manifest(Storage(root), 1)["objects"])
    assert set(m2["objects"]) <= set(listing.list_objects(Storage(arch)))  # self-contained
    assert base_objects <= set(listing.list_objects(Storage(arch)))  # copied with the delta
    assert base_objects <= set(listing.list_objects(Storage(root)))  # and kept hot
    for step in (1, 2, 3):
        assert_loads(root, step, states[step])
    plan = gc(root, "last=1", now=time.time() + 7200)
    assert 1 in plan.keep and plan.delete_steps == [3]  # 4 is kept as the latest


def test_a_corrupt_source_is_not_archived(tmp_path):
    root, arch = str(tmp_path / "hot"), str(tmp_path / "archive")
    save_steps(root, range(1, 3), full_every=1)
    st = Storage(root)
    key = sorted(
        set(rootreader.read_manifest(st, 1)["objects"])
        - set(rootreader.read_manifest(st, 2)["objects"])
    )[0]
    path = os.path.join(root, layout.object_path(key))
    with open(path, "r+b") as f:  # flip one bit of the first byte
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 1]))
    with pytest.raises(CorruptCheckpoint, match="checksum mismatch"):
        archive(root, arch, 1.0, apply=True, now=time.time() + 10)
    assert not st.exists(f"{layout.step_dir(1)}/{layout.ARCHIVED}")
    assert rows_of(root)[1].tier == "hot"


def test_archive_root_of_another_run_is_refused(tmp_path, capsys):
    arch = str(tmp_path / "archive")
    for name in ("run1", "run2"):
        save_steps(str(tmp_path / name), range(1, 3), full_every=1)
    later = time.time() + 10
    archive(str(tmp_path / "run1"), arch, 1.0, apply=True, now=later)
    rc = main(["archive", str(tmp_path / "run2"), "--older-than", "0.001s", "--to", arch, "--yes"])
    err = capsys.readouterr().err
    assert rc == 2 and "holds checkpoints of another run" in err and "Traceback" not in err


@pytest.mark.s3
def test_archive_cli_s3_to_another_bucket_dry_run_then_yes(s3_bucket, s3_env, capsys):
    import boto3

    other = f"{s3_bucket}-arch"
    boto3.client("s3", endpoint_url=s3_env).create_bucket(Bucket=other)
    root, arch = f"s3://{s3_bucket}/run/ckpt", f"s3://{other}/archive/run"
    states = save_steps(root, range(1, 4), full_every=2)  # 1 full, 2 delta, 3 full
    argv = ["archive", root, "--older-than", "0.001s", "--to", arch, "--grace", "0"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "would archive step 2" in out and "add --yes" in out
    assert not Storage(arch).listdir()  # the dry run wrote nothing
    assert main([*argv, "--yes", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["steps"] == [1, 2] and report["objects"]
    assert main(["ls", root, "--json"]) == 0
    rows = {r["step"]: r for r in json.loads(capsys.readouterr().out)}
    assert [rows[s]["tier"] for s in (1, 2, 3)] == ["archive", "archive", "hot"]
    assert rows[2]["archive_uri"] == arch and rows[2]["state"] == "committed"
    for step in (2, 3):
        assert_loads(root, step, states[step])


def test_archive_of_a_fine_tune_copies_the_objects_it_borrows(tmp_path):
    base_root, child_root = str(tmp_path / "base"), str(tmp_path / "child")
    arch = str(tmp_path / "archive")
    save_steps(base_root, [10], full_every=1)
    child = Checkpointer(child_root, full_every=1)
    child.inherit(Checkpointer(base_root), 10)
    states = {s: state(s) for s in (1, 2)}
    for s, sd in states.items():
        child.save(s, sd)
    needed = set(rootreader.read_manifest(Storage(child_root), 1)["objects"])
    assert needed - set(listing.list_objects(Storage(child_root)))  # some are borrowed
    assert archive(child_root, arch, 1.0, apply=True, now=time.time() + 10).steps == [1]
    assert needed <= set(listing.list_objects(Storage(arch)))  # self-contained copy
    assert_loads(child_root, 1, states[1])
    assert_loads(child_root, 2, states[2])


# -- issue 14: trusting markers and root identity ------------------------------------------------
@pytest.mark.parametrize("alias", ["symlink", "spelling", "inside via symlink"])
def test_archive_to_an_alias_of_the_hot_root_is_refused(tmp_path, capsys, alias):
    root = str(tmp_path / "hot")
    states = save_steps(root, range(1, 4), full_every=1)
    if alias == "symlink":
        os.symlink(root, tmp_path / "link")
        to = str(tmp_path / "link")
    elif alias == "spelling":
        os.mkdir(tmp_path / "sub")
        to = str(tmp_path / "sub" / ".." / "hot") + "/"
    else:
        os.symlink(tmp_path, tmp_path / "up")
        to = str(tmp_path / "up" / "hot" / "cold")
    before = listing.list_objects(Storage(root))
    rc = main(["archive", root, "--older-than", "0.001s", "--to", to, "--grace", "0", "--yes"])
    err = capsys.readouterr().err
    assert rc == 2 and "hot root" in err and "Traceback" not in err, err
    assert listing.list_objects(Storage(root)) == before
    for step in (1, 2, 3):
        assert not Storage(root).exists(f"{layout.step_dir(step)}/{layout.ARCHIVED}")
        assert_loads(root, step, states[step])


def test_archive_to_the_hot_root_under_another_path_is_told_by_its_marker(tmp_path):
    import shutil

    from ckptflow.core.errors import CheckpointError

    root = str(tmp_path / "hot")
    save_steps(root, range(1, 3), full_every=1)
    shutil.copytree(root, tmp_path / "mirror")  # what a bind mount or a second endpoint shows
    with pytest.raises(CheckpointError, match="hot root marker"):
        archive(root, str(tmp_path / "mirror"), 0.001, apply=True, now=time.time() + 10)
    assert not os.path.exists(os.path.join(root, layout.step_dir(1), layout.ARCHIVED))


@pytest.mark.s3
def test_archive_to_another_spelling_of_the_hot_s3_root_is_refused(s3_bucket, capsys):
    root = f"s3://{s3_bucket}/run/ckpt"
    save_steps(root, range(1, 3), full_every=1)
    before = listing.list_objects(Storage(root))
    for to in (f"s3://{s3_bucket}/run//ckpt/", f"s3://{s3_bucket}/run/./ckpt/cold"):
        rc = main(["archive", root, "--older-than", "0.001s", "--to", to, "--yes"])
        assert rc == 2 and "hot root" in capsys.readouterr().err
    assert listing.list_objects(Storage(root)) == before


def _redirect(root: str, step: int, uri: str) -> None:
    Storage(root).write(
        f"{layout.step_dir(step)}/{layout.ARCHIVED}", json.dumps({"uri": uri}).encode()
    )


def test_an_archived_marker_naming_another_run_is_a_corrupt_step(tmp_path, capsys):
    root, other = str(tmp_path / "hot"), str(tmp_path / "other")
    states = save_steps(root, range(1, 3), full_every=1)
    save_steps(other, range(1, 3), full_every=1)  # same steps, same shapes, other tensors
    _redirect(root, 2, other)
    target = {"w": torch.zeros(64, 64), "frozen": torch.zeros(16, 16), "step": -1}
    with pytest.raises(CorruptCheckpoint, match="ARCHIVED"):
        Checkpointer(root).load(target, step=2)
    assert Checkpointer(root).load(target) == 1  # fallback, never the other run's step 2
    assert torch.equal(target["w"], states[1]["w"])
    assert main(["verify", root, "--step", "2"]) == 1
    assert "CORRUPT" in capsys.readouterr().out
    assert rows_of(root)[2].state == "corrupt"


@pytest.mark.parametrize("uri", ["dangling", "http://example.com/x", "ftp://h/x", "", "torn"])
def test_a_dangling_or_unsupported_archived_marker_costs_only_its_step(tmp_path, capsys, uri):
    root = str(tmp_path / "hot")
    states = save_steps(root, range(1, 4), full_every=1)
    if uri == "torn":  # written in place by someone else and cut short: damage, not "hot"
        Storage(root).write(f"{layout.step_dir(3)}/{layout.ARCHIVED}", b'{"uri": "/ar')
    else:
        _redirect(root, 3, str(tmp_path / "gone") if uri == "dangling" else uri)
    target = {"w": torch.zeros(64, 64), "frozen": torch.zeros(16, 16), "step": -1}
    assert Checkpointer(root).load(target) == 2  # falls back past the bad redirect
    assert torch.equal(target["w"], states[2]["w"])
    assert main(["ls", root]) == 0
    out = capsys.readouterr().out
    assert "corrupt" in out and "ARCHIVED" in out
    report = gc(root, "last=2", now=time.time() + 7200)
    assert report.keep == {1: ["last-2"], 2: ["last-2", "latest-valid"]}


def test_a_killed_archiver_leaves_no_torn_marker(tmp_path, monkeypatch):
    root, arch = str(tmp_path / "hot"), str(tmp_path / "archive")
    states = save_steps(root, range(1, 4), full_every=1)
    real = localfs._write_fd

    def killed(path, data, flags, durable):
        if "ARCHIVED" in os.path.basename(path):
            os.close(os.open(path, flags, 0o644))  # opened, then the process is killed
            raise KeyboardInterrupt("archiver killed")
        return real(path, data, flags, durable)

    monkeypatch.setattr(localfs, "_write_fd", killed)
    with pytest.raises(KeyboardInterrupt):
        archive(root, arch, 0.001, apply=True, now=time.time() + 10, grace_s=0)
    monkeypatch.setattr(localfs, "_write_fd", real)
    assert not Storage(root).exists(f"{layout.step_dir(1)}/{layout.ARCHIVED}")
    rows = rows_of(root)
    assert [rows[s].state for s in (1, 2, 3)] == ["committed"] * 3 and rows[1].tier == "hot"
    report = gc(root, "last=3", apply=True, now=time.time() + 7200)
    assert report.delete_steps == [] and rootreader.committed_steps(Storage(root)) == [1, 2, 3]
    assert archive(root, arch, 0.001, apply=True, now=time.time() + 10, grace_s=0).steps == [1, 2]
    assert rows_of(root)[1].tier == "archive"
    for step in (1, 2, 3):
        assert_loads(root, step, states[step])


def test_an_alias_in_the_archive_root_does_not_stand_in_for_an_object(tmp_path):
    """A file named like a step's object but under another folder of the archive root: the
    archive took it for the object and skipped copying it; its own check then found the copy
    missing and failed, so no step could be archived to that root."""
    root, arch = str(tmp_path / "hot"), str(tmp_path / "archive")
    states = save_steps(root, [1, 2], full_every=1)
    for key in rootreader.read_manifest(Storage(root), 1)["objects"]:
        wrong = "00" if not key.startswith("00") else "ff"
        alias = os.path.join(arch, layout.OBJECTS, wrong, key)
        os.makedirs(os.path.dirname(alias), exist_ok=True)
        with open(os.path.join(root, layout.object_path(key)), "rb") as src:
            data = src.read()
        with open(alias, "wb") as f:
            f.write(data)
    report = archive(root, arch, 0.0, apply=True, now=time.time() + 10, grace_s=0)
    assert report.steps == [1]
    assert_loads(root, 1, states[1])

"""Weights-only demotion (ckptflow.core.slim) on real checkpoints: what is dropped, what still
loads (deltas on a slimmed base), what fails clearly, what GC frees, hostile SLIM markers."""

from __future__ import annotations

import json
import os

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer

from ckptflow import cli
from ckptflow.core import layout, listing, marks, rootreader, slim
from ckptflow.core.errors import CheckpointError, SlimmedCheckpoint
from ckptflow.core.gc import gc
from ckptflow.core.retention import Policy
from ckptflow.core.storage import Storage

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
DAY = 86400.0


def train_state(seed: int) -> dict:
    """A training state as ckptflow.steps.lib.state lays it out (model, optim, rng, data)."""
    # a small step apart per seed, as training moves a state: deltas pay (since deltas are
    # chosen per part, independent random values would be stored full)
    base, g = torch.Generator().manual_seed(0), torch.Generator().manual_seed(seed)
    w, m, v = (torch.randn(128, 128, generator=base) for _ in range(3))

    def moved(t: torch.Tensor) -> torch.Tensor:
        return t + 1e-4 * seed * torch.randn(t.shape, generator=g)

    return {
        "model": {"w": moved(w), "b": torch.full((128,), float(seed))},
        "optim": {"m": moved(m), "v": moved(v.abs())},
        "rng": {"rank0": {"seed": seed}},
        "data": {"position": seed * 10},
        "step": seed,
    }


def blank(full: bool = True) -> dict:
    out = {"model": {"w": torch.zeros(128, 128), "b": torch.zeros(128)}, "step": -1}
    if full:
        out |= {"optim": {"m": torch.zeros(128, 128), "v": torch.zeros(128, 128)}}
        out |= {"rng": {"rank0": {"seed": -1}}, "data": {"position": -1}}
    return out


@pytest.fixture
def root(tmp_path):
    """Steps 1-4, every other one a delta: 1 full, 2 delta<1, 3 full, 4 delta<3."""
    uri = str(tmp_path / "ckpt")
    ck = Checkpointer(uri, full_every=2)
    saved = {s: train_state(s) for s in (1, 2, 3, 4)}
    for s, sd in saved.items():
        ck.save(s, sd)
    ck.close()
    return uri, saved


def object_bytes(uri: str) -> int:
    return sum(e.size for e in listing.list_objects(Storage(uri)).values())


def test_slim_drops_optimizer_and_gc_frees_it_while_everything_still_loads(root):
    uri, saved = root
    before = object_bytes(uri)
    report = slim.slim(uri, 1 * DAY, apply=True, now=_later())
    # 4 is the latest, 3 its base: never slimmed; 1 and 2 are
    assert sorted(report.slimmed) == [1, 2]
    assert report.skipped == {4: "latest valid", 3: "base of the latest step 4"}
    assert report.full_state_steps == [3, 4] and report.bytes_after < report.bytes_before
    st = Storage(uri)
    m = rootreader.read_manifest(st, 1)
    assert set(m["tensors"]) == {"model.w", "model.b"} and m["values"] == ["step"]
    assert m["slimmed"]["kept"] == ["model", "step"] and m["slimmed"]["dropped_entries"] == 4
    rows = {r.step: r for r in listing.build_rows(st, now=_later())}
    assert rows[1].slimmed_at is not None and rows[3].slimmed_at is None
    freed = gc(uri, "last=10", apply=True, grace_s=0, now=_later())
    assert freed.objects and len(freed.orphan_files) == 2  # the 2 original manifests
    assert before - object_bytes(uri) == report.bytes_before - report.bytes_after > 0
    # the original manifests of slimmed steps are gone, the slimmed ones stay
    assert len([n for n in st.listdir("step-00000001") if n.startswith("manifest-")]) == 1
    ck = Checkpointer(uri)
    for step in (1, 2):  # 2 is a delta on the slimmed 1: its weights still load
        target = blank(full=False)
        assert ck.load(target, step=step) == step
        assert torch.equal(target["model"]["w"], saved[step]["model"]["w"])
        ck.verify(step)
    target = blank()
    assert ck.load(target, step=4) == 4  # the delta on the whole step 3 loads in full
    assert torch.equal(target["optim"]["v"], saved[4]["optim"]["v"])
    assert target["data"]["position"] == 40
    ck.close()


def test_loading_a_slimmed_step_with_optimizer_state_fails_clearly(root):
    uri, _ = root
    slim.slim(uri, 1 * DAY, apply=True, now=_later())
    ck = Checkpointer(uri)
    with pytest.raises(SlimmedCheckpoint) as exc:
        ck.load(blank(), step=1)
    text = str(exc.value)
    assert "step 1 under" in text and "slimmed to weights only at" in text
    assert "steps with their full state: [3, 4]" in text and "optim.m" in text
    ck.close()


def test_a_delta_whose_base_is_slimmed_still_loads_in_full(root):
    uri, saved = root
    st = Storage(uri)
    assert slim.slim_step(st, 1, slim.DEFAULT_KEEP, _later()) is not None
    assert slim.slim_step(st, 1, slim.DEFAULT_KEEP, _later()) is None  # once only
    # nothing to free: the delta 2 still references 1's optimizer objects (its XOR bases)
    assert gc(uri, "last=10", apply=True, grace_s=0, now=_later()).objects == []
    ck = Checkpointer(uri)
    target = blank()
    assert ck.load(target, step=2) == 2  # its optimizer parts are deltas on 1's optimizer
    assert torch.equal(target["optim"]["m"], saved[2]["optim"]["m"])
    ck.verify(2)
    ck.close()


def test_within_the_grace_gc_keeps_what_the_full_step_needed(root):
    uri, _ = root
    before = object_bytes(uri)
    slim.slim(uri, 1 * DAY, apply=True)  # the steps are fresh: nothing is old enough
    assert object_bytes(uri) == before
    slim.slim_step(Storage(uri), 1, slim.DEFAULT_KEEP, __import__("time").time())
    gc(uri, "last=10", apply=True, grace_s=3600)  # a reader may still load step 1 in full
    assert object_bytes(uri) == before
    assert len([n for n in os.listdir(f"{uri}/step-00000001") if n.startswith("manifest-")]) == 2


def test_slim_dry_run_and_refusals(root):
    uri, _ = root
    report = slim.slim(uri, 1 * DAY, now=_later())
    assert sorted(report.slimmed) == [1, 2] and not report.applied
    assert rootreader.read_manifest(Storage(uri), 1).get("slimmed") is None
    with pytest.raises(CheckpointError, match="no tensor lies under"):
        slim.slim(uri, 1 * DAY, keep=("encoder",), apply=True, now=_later())


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: b"{not json", "slim marker is unreadable"),
        (lambda d: json.dumps(d | {"of_save_id": "0" * 16}).encode(), "another save"),
        (lambda d: json.dumps(d | {"manifest_xxh3": "0" * 32}).encode(), "checksum"),
        (lambda d: json.dumps(d | {"slimmed_at": 1e300}).encode(), "malformed"),
        (lambda d: json.dumps(d | {"save_id": "../../x"}).encode(), "malformed"),
    ],
)
def test_a_hostile_slim_marker_makes_only_that_step_corrupt(root, damage, message):
    uri, _ = root
    st = Storage(uri)
    slim.slim_step(st, 3, slim.DEFAULT_KEEP, _later())
    rel = f"{layout.step_dir(3)}/{layout.SLIM}"
    doc = json.loads(st.read(rel))
    st.write(rel, damage(doc))
    rows = {r.step: r for r in listing.build_rows(st, now=_later())}
    assert rows[3].state == "corrupt"
    with pytest.raises(Exception, match=message):
        rootreader.read_manifest(st, 3)
    assert [rows[s].state for s in (1, 2, 4)] == ["committed"] * 3


def test_a_corrupt_marker_makes_readers_fall_back_and_retention_not_count_it(root):
    uri, saved = root
    st = Storage(uri)
    assert marks.mark_corrupt(st, 4, "verification drill: checksum mismatch", "drill")
    assert not marks.mark_corrupt(st, 4, "again", "drill")
    ck = Checkpointer(uri)
    target = blank()
    assert ck.load(target) == 3 and ck.latest() == 3
    ck.close()
    rows = {r.step: r for r in listing.build_rows(st, now=_later())}
    assert rows[4].state == "corrupt" and "CORRUPT" in rows[4].problems[0]
    report = gc(uri, "last=1", grace_s=0)
    assert report.keep[3] == ["last-1", "latest-valid"] and 4 in report.delete_steps


def test_policy_terms_per_kind_and_slim_round_trip_and_gc_slims():
    p = Policy.parse("last=1,delta=7d,full=30d,slim=7d")
    assert (p.keep_delta, p.keep_full, p.slim) == ("7d", "30d", "7d")
    assert Policy.parse(p.to_spec()) == p
    with pytest.raises(ValueError, match="bad duration"):
        Policy.parse("slim=soon")


def test_gc_with_slim_policy(root):
    uri, _ = root
    report = gc(uri, "last=10,slim=1d", apply=True, grace_s=0, now=_later())
    assert sorted(report.slimmed) == [1, 2] and report.objects
    rows = {r.step: r for r in listing.build_rows(Storage(uri), now=_later(), check=True)}
    assert all(r.state == "committed" for r in rows.values())
    assert [s for s, r in rows.items() if r.slimmed_at] == [1, 2]


def test_ckpt_slim_cli(root, capsys):
    uri, _ = root
    assert cli.main(["ckpt", "slim", uri, "--older-than", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert sorted(out["slimmed"]) == ["1", "2"] and out["bytes_freed_by_gc"] > 0
    assert cli.main(["ckpt", "slim", uri, "--older-than", "0", "--yes"]) == 0
    assert "slimmed 2 step(s)" in capsys.readouterr().out
    assert cli.main(["ckpt", "ls", uri]) == 0
    assert "full,slim" in capsys.readouterr().out


def _later() -> float:
    import time

    return time.time() + 2 * DAY


def test_a_slimmed_step_archives_and_loads_from_the_archive(root, tmp_path):
    from ckptflow.core.archive import archive

    uri, saved = root
    slim.slim(uri, 1 * DAY, apply=True, now=_later())
    gc(uri, "last=10", apply=True, grace_s=0, now=_later())  # the original manifests go
    report = archive(uri, str(tmp_path / "arch"), 0, apply=True, grace_s=0)
    assert sorted(report.as_dict()["steps"]) == [1, 2]
    ck = Checkpointer(uri)
    for step in (1, 2):
        target = blank(full=False)
        assert ck.load(target, step=step) == step
        assert torch.equal(target["model"]["w"], saved[step]["model"]["w"])
    with pytest.raises(SlimmedCheckpoint):
        ck.load(blank(), step=2)
    ck.close()

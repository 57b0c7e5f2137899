"""GC on real checkpoints (made with Checkpointer) on local disk and the in-process S3 server."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer, CheckpointError

from ckptflow.core import layout, listing, rootreader
from ckptflow.core.gc import gc
from ckptflow.core.policy_syntax import PolicyError
from ckptflow.core.retention import Policy
from ckptflow.core.storage import Storage

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
HOUR = 3600.0


def state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(64, 64, generator=g),
        "frozen": torch.ones(32, 32),  # identical in every step: deduplicated
        "step": seed,
    }


def blank() -> dict:
    return {"w": torch.zeros(64, 64), "frozen": torch.zeros(32, 32), "step": -1}


def save_steps(root: str, steps, full_every: int = 3, **kw) -> dict[int, dict]:
    ck = Checkpointer(root, full_every=full_every, **kw)
    out = {}
    for s in steps:
        out[s] = state(s)
        ck.save(s, out[s])
    ck.close()
    return out


def assert_loads(root: str, step: int, expected: dict) -> None:
    target = blank()
    ck = Checkpointer(root)
    assert ck.load(target, step=step) == step
    ck.verify(step)
    assert torch.equal(target["w"], expected["w"]) and torch.equal(
        target["frozen"], expected["frozen"]
    )
    assert target["step"] == expected["step"]


def age_tree(path: str, seconds: float) -> None:
    """Make every file under `path` look `seconds` old (what a later gc would see)."""
    t = time.time() - seconds
    for d, _, files in os.walk(path):
        for f in files:
            os.utime(os.path.join(d, f), (t, t))


def tree(path: str) -> dict[str, int]:
    """Every checkpoint file under `path` (the health log under events/ is not checkpoint data:
    saves, loads and gc add to it, ckptflow.core.health)."""
    return {
        rel: os.path.getsize(os.path.join(path, rel))
        for d, _, files in os.walk(path)
        for f in files
        if not (rel := os.path.relpath(os.path.join(d, f), path)).startswith("events/")
    }


def top(path: str) -> list[str]:
    """The root's top-level names, less the health log (events/)."""
    return sorted(n for n in os.listdir(path) if n != "events")


class PausingStorage(Storage):
    """A real Storage whose writes of matching files wait until released (a slow save)."""

    def __init__(self, uri: str, match):
        super().__init__(uri)
        self.match, self.reached, self.release = match, threading.Event(), threading.Event()

    def write(self, rel, data, *, exclusive=False, **kw):
        if self.match(rel) and not self.release.is_set():
            self.reached.set()
            assert self.release.wait(60), "test never released the paused save"
        super().write(rel, data, exclusive=exclusive, **kw)


class HookStorage(Storage):
    """A real Storage that runs `hook` before its first delete (something happens mid-GC)."""

    def __init__(self, uri: str, hook):
        super().__init__(uri)
        self.hook = hook

    def delete(self, rels):
        hook, self.hook = self.hook, None
        if hook:
            hook()
        super().delete(rels)


class FailingStorage(Storage):
    """A real Storage that crashes after `n` deletes (a GC killed midway)."""

    def __init__(self, uri: str, n: int):
        super().__init__(uri)
        self.left = n

    def delete(self, rels):
        if self.left <= 0:
            raise KeyboardInterrupt("gc killed")
        self.left -= 1
        super().delete(rels)


def objects_of(root: str, step: int) -> set[str]:
    return set(rootreader.read_manifest(Storage(root), step)["objects"])


def test_dry_run_deletes_nothing_and_yes_frees_the_reported_bytes(tmp_path):
    root = str(tmp_path / "ckpt")
    states = save_steps(root, range(1, 8))
    before = tree(root)
    dry = gc(root, "last=1", now=time.time() + 2 * HOUR)
    assert not dry.applied and tree(root) == before
    assert dry.delete_steps == [1, 2, 3, 4, 5, 6] and dry.keep == {7: ["last-1", "latest-valid"]}
    real = gc(root, "last=1", apply=True, now=time.time() + 2 * HOUR)
    after = tree(root)
    assert real.delete_steps == dry.delete_steps and real.objects == dry.objects
    assert real.bytes_freed == dry.bytes_freed == sum(before.values()) - sum(after.values())
    assert rootreader.committed_steps(Storage(root)) == [7]
    assert top(root) == ["ckptflow-root.json", "objects", "step-00000007"]
    on_disk = {p.rsplit("/", 1)[-1] for p in after if p.startswith("objects/")}
    assert on_disk == objects_of(root, 7)  # nothing unreferenced is left
    assert_loads(root, 7, states[7])
    again = gc(root, "last=1", apply=True, now=time.time() + 2 * HOUR)
    assert again.delete_steps == [] and again.objects == [] and again.bytes_freed == 0


def test_kept_delta_keeps_its_base_and_deleted_delta_objects_are_freed(tmp_path):
    root = str(tmp_path / "ckpt")
    states = save_steps(root, range(1, 7))  # 1 full, 2-3 deltas of 1, 4 full, 5-6 deltas of 4
    m6 = rootreader.read_manifest(Storage(root), 6)
    assert (m6["kind"], m6["base_step"]) == ("delta", 4)
    only5 = objects_of(root, 5) - objects_of(root, 4) - objects_of(root, 6)
    assert only5
    report = gc(root, Policy(keep_last=1), apply=True, now=time.time() + 2 * HOUR)
    assert report.keep == {4: ["base-of:6"], 6: ["last-1", "latest-valid"]}
    assert report.delete_steps == [1, 2, 3, 5]
    assert only5 <= set(report.objects)
    present = listing.list_objects(Storage(root))
    assert not only5 & set(present) and objects_of(root, 6) <= set(present)
    assert_loads(root, 6, states[6])
    assert_loads(root, 4, states[4])


def test_pinned_step_and_its_base_survive_until_unpinned(tmp_path):
    from ckptflow.ckpt_cli import main

    root = str(tmp_path / "ckpt")
    states = save_steps(root, range(1, 5))
    assert main(["pin", root, "2", "--reason", "published v1"]) == 0
    report = gc(root, "last=1", apply=True, now=time.time() + 2 * HOUR)
    assert report.keep[2] == ["pinned"] and report.keep[1] == ["base-of:2"]
    assert rootreader.committed_steps(Storage(root)) == [1, 2, 4]
    assert_loads(root, 2, states[2])
    assert main(["unpin", root, "2"]) == 0
    report = gc(root, "last=1", apply=True, now=time.time() + 2 * HOUR)
    assert report.delete_steps == [1, 2]
    assert rootreader.committed_steps(Storage(root)) == [4]


def test_gc_while_an_async_save_runs_leaves_it_whole(tmp_path):
    root = str(tmp_path / "ckpt")
    save_steps(root, range(1, 4), full_every=1)
    age_tree(root, 3 * HOUR)  # the committed steps are old; the save below is fresh
    paused = PausingStorage(root, lambda rel: "/manifest-" in rel)
    ck = Checkpointer(root, full_every=1, storage=paused)
    new = state(4)
    handle = ck.save(4, new, block=False)
    assert paused.reached.wait(30)  # objects and intent written, manifest not yet
    in_flight = {p for p in tree(root) if p.startswith("step-00000004") or p.startswith("objects")}
    report = gc(root, "last=1", apply=True)
    assert report.in_progress == [4] and report.leftovers == []
    assert report.delete_steps == [1, 2] and report.objects  # old data was collected
    left = set(tree(root))
    assert {p for p in in_flight if p.startswith("step-00000004")} <= left
    new_objects = {p for p in in_flight if p.startswith("objects")} - {
        layout.object_path(k) for k in report.objects
    }
    assert new_objects <= left
    paused.release.set()
    handle.wait()
    ck.close()
    assert_loads(root, 4, new)
    assert gc(root, "last=1", apply=True).in_progress == []


def test_objects_of_a_save_that_commits_during_gc_are_kept(tmp_path):
    # The save's objects look old (as content revived by a rewrite can), so only looking again
    # (committed steps, pending manifests) right before objects are deleted protects them.
    root = str(tmp_path / "ckpt")
    save_steps(root, range(1, 3), full_every=1)
    paused = PausingStorage(root, lambda rel: "/manifest-" in rel)
    ck = Checkpointer(root, full_every=1, storage=paused)
    new = state(3)
    handle = ck.save(3, new, block=False)
    assert paused.reached.wait(30)
    age_tree(os.path.join(root, "objects"), 3 * HOUR)

    def commit_now():
        paused.release.set()
        handle.wait()

    report = gc(root, "last=1", apply=True, storage=HookStorage(root, commit_now))
    assert report.delete_steps == [1] and report.in_progress == [3] and report.leftovers == []
    assert not objects_of(root, 3) & set(report.objects)
    ck.close()
    assert_loads(root, 3, new)


def test_crashed_save_leftover_is_removed_only_after_the_grace(tmp_path):
    root = str(tmp_path / "ckpt")
    states = save_steps(root, range(1, 3), full_every=1)

    class Crash(Storage):
        def write(self, rel, data, *, exclusive=False, **kw):
            if "/manifest-" in rel:
                raise OSError("node lost")
            super().write(rel, data, exclusive=exclusive, **kw)

    with pytest.raises(OSError):
        Checkpointer(root, storage=Crash(root)).save(3, state(3))
    young = gc(root, "last=1", apply=True)
    assert young.in_progress == [3] and os.path.isdir(os.path.join(root, "step-00000003"))
    old = gc(root, "last=1", apply=True, now=time.time() + 2 * HOUR)
    assert old.leftovers == [3] and not os.path.exists(os.path.join(root, "step-00000003"))
    present = set(listing.list_objects(Storage(root)))
    assert present == objects_of(root, 2)  # the crashed save's objects are gone too
    assert_loads(root, 2, states[2])


def test_losing_racer_manifest_is_removed_after_the_grace(tmp_path):
    root = str(tmp_path / "ckpt")
    save_steps(root, [1], full_every=1)
    paused = PausingStorage(root, lambda rel: rel.endswith("/COMMIT"))
    loser = Checkpointer(root, full_every=1, storage=paused)
    handle = loser.save(2, state(20), block=False)
    assert paused.reached.wait(30)
    winner = state(2)
    save_steps(root, [2], full_every=1)
    paused.release.set()
    with pytest.raises(CheckpointError, match="committed by another writer"):
        loser.close()  # waits for the save and re-raises its failure
    assert handle.done()
    names = os.listdir(os.path.join(root, "step-00000002"))
    assert sum(n.startswith("manifest-") for n in names) == 2
    assert gc(root, "last=5", apply=True).orphan_files == []  # younger than the grace
    report = gc(root, "last=5", apply=True, now=time.time() + 2 * HOUR)
    assert len(report.orphan_files) == 2  # its manifest and its intent
    names = os.listdir(os.path.join(root, "step-00000002"))
    assert sum(n.startswith("manifest-") for n in names) == 1
    assert set(report.objects) and not set(report.objects) & objects_of(root, 2)
    assert_loads(root, 2, winner)


@pytest.mark.parametrize("crash_after", [0, 1, 3, 6])
def test_a_crash_mid_gc_leaves_nothing_a_later_gc_cannot_finish(tmp_path, crash_after):
    root = str(tmp_path / "ckpt")
    states = save_steps(root, range(1, 8))
    later = time.time() + 2 * HOUR
    with pytest.raises(KeyboardInterrupt):
        gc(root, "last=1", apply=True, now=later, storage=FailingStorage(root, crash_after))
    st = Storage(root)
    for step in rootreader.committed_steps(st):  # whatever is still committed is whole
        Checkpointer(root).verify(step)
    gc(root, "last=1", apply=True, now=later + 2 * HOUR)
    assert rootreader.committed_steps(st) == [7]
    assert set(listing.list_objects(st)) == objects_of(root, 7)
    assert top(root) == ["ckptflow-root.json", "objects", "step-00000007"]
    assert_loads(root, 7, states[7])


def test_corrupt_step_is_collected_and_latest_valid_kept(tmp_path):
    root = str(tmp_path / "ckpt")
    states = save_steps(root, range(1, 4), full_every=1)
    victim = sorted(objects_of(root, 3) - objects_of(root, 2))[0]
    os.remove(os.path.join(root, layout.object_path(victim)))
    report = gc(root, "last=1", apply=True, now=time.time() + 2 * HOUR)
    assert report.keep == {2: ["last-1", "latest-valid"]} and report.delete_steps == [1, 3]
    assert_loads(root, 2, states[2])


def test_bare_thinning_spec_is_accepted(tmp_path):
    root = str(tmp_path / "ckpt")
    save_steps(root, range(1, 4), full_every=1)
    report = gc(root, "2h:all,1d:1h,7d:1d,*:7d")
    assert report.policy == "thin=2h:all/1d:1h/7d:1d/*:7d" and report.delete_steps == []


@pytest.mark.s3
def test_gc_on_s3_with_a_delta_base_and_a_concurrent_save(s3_bucket):
    root = f"s3://{s3_bucket}/run/ckpt"
    states = save_steps(root, range(1, 5), full_every=2)  # 1 3 full, 2 4 deltas
    time.sleep(2.5)  # S3 times have no utime: the committed data is 2.5 s old, the save fresh
    paused = PausingStorage(root, lambda rel: "/manifest-" in rel)
    ck = Checkpointer(root, full_every=1, storage=paused)
    handle = ck.save(5, state(5), block=False)
    assert paused.reached.wait(30)
    only2 = objects_of(root, 2) - objects_of(root, 1) - objects_of(root, 4)
    report = gc(root, "last=1", apply=True, grace_s=2.0)
    assert report.keep == {3: ["base-of:4"], 4: ["last-1", "latest-valid"]}
    assert report.delete_steps == [1, 2] and report.in_progress == [5]
    present = set(listing.list_objects(Storage(root)))
    assert present >= objects_of(root, 4) and not present & only2
    paused.release.set()
    handle.wait()
    ck.close()
    assert_loads(root, 4, states[4])
    assert_loads(root, 5, state(5))


def test_fine_tune_root_borrowing_objects_from_its_parent_is_valid(tmp_path):
    base_root, child_root = str(tmp_path / "base"), str(tmp_path / "child")
    save_steps(base_root, [10], full_every=1)
    child = Checkpointer(child_root, full_every=1)
    child.inherit(Checkpointer(base_root), 10)
    states = {s: state(s) for s in (1, 2, 3)}
    for s, sd in states.items():
        child.save(s, sd)  # "frozen" is the base's: referenced there, not stored here
    borrowed = objects_of(child_root, 3) - set(listing.list_objects(Storage(child_root)))
    assert borrowed and borrowed <= objects_of(base_root, 10)
    rows = listing.build_rows(Storage(child_root), now=time.time())
    assert [r.state for r in rows] == ["committed"] * 3
    report = gc(child_root, "last=1", apply=True, now=time.time() + 2 * HOUR)
    assert report.delete_steps == [1, 2] and not set(report.objects) & borrowed
    assert objects_of(base_root, 10) <= set(listing.list_objects(Storage(base_root)))
    assert_loads(child_root, 3, states[3])


def test_a_step_pinned_while_gc_runs_is_kept(tmp_path):
    from ckptflow.ckpt_cli import main

    root = str(tmp_path / "ckpt")
    states = save_steps(root, range(1, 5), full_every=1)
    hook = HookStorage(root, lambda: main(["pin", root, "3", "--reason", "late publish"]))
    report = gc(root, "last=1", apply=True, now=time.time() + 2 * HOUR, storage=hook)
    assert report.delete_steps == [1, 2] and "step 3 was pinned during gc; kept" in report.warnings
    assert rootreader.committed_steps(Storage(root)) == [3, 4]
    assert_loads(root, 3, states[3])


# -- issue 14: what GC trusts ----------------------------------------------------------------------
def test_a_lost_root_marker_makes_gc_refuse_and_keeps_every_step(tmp_path, capsys):
    from ckptflow.ckpt_cli import main
    from ckptflow.core.errors import CheckpointError as CoreError

    root = str(tmp_path / "ckpt")
    states = save_steps(root, range(1, 4), full_every=1)
    marker = os.path.join(root, layout.ROOT_MARKER)
    for damage in ("lost", "garbled"):
        if damage == "lost":
            os.remove(marker)
        else:
            with open(marker, "wb") as f:
                f.write(b'{"format": "ckptf')  # torn
        before = tree(root)
        with pytest.raises(CoreError, match="root marker"):
            gc(root, "last=1", apply=True, now=time.time() + 2 * HOUR)
        rc = main(["gc", root, "--policy", "last=1", "--grace", "0", "--yes"])
        err = capsys.readouterr().err
        assert rc == 2 and "repair" in err and "Traceback" not in err
        assert tree(root) == before  # nothing deleted
        assert rootreader.committed_steps(Storage(root)) == [1, 2, 3]
        for step in (1, 3):
            assert_loads(root, step, states[step])  # every manifest agrees on the root id
        target = blank()
        assert Checkpointer(root).load(target) == 3
        with pytest.raises(CheckpointError, match="root marker"):
            Checkpointer(root).save(4, state(4))  # never a fresh root id over old steps
        assert tree(root) == before
    assert main(["repair", root]) == 0 and "would restore" in capsys.readouterr().out
    assert main(["repair", root, "--yes"]) == 0
    assert (
        rootreader.read_root_id(Storage(root))
        == rootreader.read_manifest(Storage(root), 1)["root_id"]
    )
    save_steps(root, [4], full_every=1)
    report = gc(root, "last=1", apply=True, now=time.time() + 2 * HOUR)
    assert report.delete_steps == [1, 2, 3]
    assert_loads(root, 4, state(4))


def flip_byte(path: str, at: int = 0) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x40]))


def test_a_flipped_byte_in_the_newest_step_keeps_the_last_good_one(tmp_path):
    root = str(tmp_path / "ckpt")
    states = save_steps(root, range(1, 4), full_every=1)
    victim = sorted(objects_of(root, 3) - objects_of(root, 2))[0]
    flip_byte(os.path.join(root, layout.object_path(victim)), 5)  # same size, other content
    report = gc(root, "last=1", apply=True, now=time.time() + 2 * HOUR)
    assert report.keep == {2: ["last-1", "latest-valid"]} and report.delete_steps == [1, 3]
    assert any("step 3" in w and "checksum" in w for w in report.warnings), report.warnings
    assert_loads(root, 2, states[2])


@pytest.mark.parametrize("where", ["data", "manifest"])
def test_gc_with_zero_grace_leaves_a_live_save_whole(tmp_path, where):
    root = str(tmp_path / "ckpt")
    save_steps(root, range(1, 3), full_every=1)
    age_tree(root, 3 * HOUR)
    seen = []

    def pause_at(rel):  # the second object of the new save, or its manifest
        if where == "data" and rel.startswith("objects/"):
            seen.append(rel)
            return len(seen) == 2
        return where == "manifest" and "/manifest-" in rel

    paused = PausingStorage(root, pause_at)
    ck = Checkpointer(root, full_every=1, storage=paused)
    new = state(3)
    handle = ck.save(3, new, block=False)
    assert paused.reached.wait(30)
    in_flight = {p for p in tree(root) if p.startswith("step-00000003")}
    report = gc(root, "last=1", apply=True, grace_s=0)
    assert report.in_progress == [3] and report.leftovers == [], report.lines()
    assert report.delete_steps == [1]
    assert in_flight <= set(tree(root))
    paused.release.set()
    handle.wait()
    ck.close()
    assert_loads(root, 3, new)


def test_a_save_stays_live_past_its_lease_while_it_heartbeats(tmp_path, monkeypatch):
    from ckptflow.steps.checkpoint import save_intent

    monkeypatch.setattr(save_intent, "HEARTBEAT_S", 0.05)
    monkeypatch.setattr(layout, "SAVE_LEASE_S", 0.5)
    root = str(tmp_path / "ckpt")
    save_steps(root, range(1, 3), full_every=1)
    age_tree(root, 3 * HOUR)
    paused = PausingStorage(root, lambda rel: "/manifest-" in rel)
    ck = Checkpointer(root, full_every=1, storage=paused)
    new = state(3)
    handle = ck.save(3, new, block=False)
    assert paused.reached.wait(30)
    time.sleep(1.0)  # two leases: only the heartbeat keeps the intent fresh
    report = gc(root, "last=1", apply=True, grace_s=0)
    assert report.in_progress == [3], report.lines()
    paused.release.set()
    handle.wait()
    ck.close()
    assert_loads(root, 3, new)
    time.sleep(1.0)  # committed: the heartbeat stopped
    intent = [e for e in listing.step_files(Storage(root), 3) if "/saving-" in e.path]
    assert intent and intent[0].mtime < time.time() - 0.9


def test_a_commit_over_a_missing_object_fails_the_save(tmp_path):
    root = str(tmp_path / "ckpt")
    save_steps(root, [1], full_every=1)
    paused = PausingStorage(root, lambda rel: "/manifest-" in rel)
    ck = Checkpointer(root, full_every=1, storage=paused)
    handle = ck.save(2, state(2), block=False)
    assert paused.reached.wait(30)
    mine = set(listing.list_objects(Storage(root))) - objects_of(root, 1)
    os.remove(os.path.join(root, layout.object_path(sorted(mine)[0])))  # a GC of old
    paused.release.set()
    with pytest.raises(CheckpointError, match="not committed.*missing"):
        ck.close()  # waits for the save and re-raises its failure
    assert handle.done() and rootreader.committed_steps(Storage(root)) == [1]


@pytest.mark.s3
def test_gc_with_zero_grace_on_s3_leaves_a_heartbeating_save_whole(s3_bucket, monkeypatch):
    from ckptflow.steps.checkpoint import save_intent

    monkeypatch.setattr(save_intent, "HEARTBEAT_S", 0.2)
    monkeypatch.setattr(layout, "SAVE_LEASE_S", 1.5)  # S3 times have whole seconds
    root = f"s3://{s3_bucket}/run/ckpt"
    save_steps(root, range(1, 3), full_every=1)
    paused = PausingStorage(root, lambda rel: "/manifest-" in rel)
    ck = Checkpointer(root, full_every=1, storage=paused)
    new = state(3)
    handle = ck.save(3, new, block=False)
    assert paused.reached.wait(30)
    time.sleep(3.0)  # two leases: only the heartbeat (a put of the same intent) keeps it live
    report = gc(root, "last=1", apply=True, grace_s=0)
    assert report.in_progress == [3] and report.delete_steps == [1], report.lines()
    paused.release.set()
    handle.wait()
    ck.close()
    assert_loads(root, 3, new)


def test_an_old_alias_of_a_young_object_does_not_get_it_collected(tmp_path):
    """An adversary's copy of a young unreferenced object (a live save's, not yet named by a
    manifest), under another folder and dated hours back: GC took its age for the object's
    and deleted the real one within the grace."""
    root = str(tmp_path / "ckpt")
    save_steps(root, [1], full_every=1)
    key = "00" + "ab" * 15
    real = os.path.join(root, layout.object_path(key))
    os.makedirs(os.path.dirname(real), exist_ok=True)
    with open(real, "wb") as f:
        f.write(b"a save's fresh object")
    alias = os.path.join(root, layout.OBJECTS, "ff", key)
    os.makedirs(os.path.dirname(alias), exist_ok=True)
    with open(alias, "wb") as f:
        f.write(b"a save's fresh object")
    old = time.time() - 10 * HOUR
    os.utime(alias, (old, old))
    report = gc(root, "last=1", apply=True)
    assert key not in report.objects and os.path.exists(real)


@pytest.mark.parametrize(
    ("policy", "phrase"),
    [
        ("best=acc:max:1", "no checkpoint has metric 'acc' (they have: val_loss)"),
        ("last=1,best=val_loss:min:1,best=acc:max:1", "no checkpoint has metric 'acc'"),
        ("delta=7d", "no checkpoint is a delta"),
    ],
)
def test_a_policy_naming_what_no_checkpoint_has_is_refused(tmp_path, capsys, policy, phrase):
    """`best=acc:max:1` with no `acc` anywhere was ignored and gc planned to delete 6 steps:
    with --yes a typo deleted checkpoints (issue 38, point 5). Now: one line, exit 2."""
    from ckptflow.ckpt_cli import main
    from ckptflow.core import runroot

    root = str(tmp_path / "ckpt")
    save_steps(root, range(1, 5), full_every=1)
    for step in range(1, 5):
        runroot.write_eval(Storage(root), runroot.EvalRecord(step, metrics={"val_loss": 1.0}))
    before = tree(root)
    with pytest.raises(PolicyError, match="no checkpoint"):
        gc(root, policy, apply=True, now=time.time() + 2 * HOUR)
    rc = main(["gc", root, "--policy", policy, "--grace", "0", "--yes"])
    err = capsys.readouterr().err
    assert rc == 2 and phrase in err and err.count("\n") == 1, err
    assert tree(root) == before  # nothing deleted
    assert gc(root, "best=val_loss:min:1,full=7d").delete_steps == []  # what exists is fine


def test_a_root_with_no_checkpoint_yet_is_no_policy_error(tmp_path):
    """The retention CronWorkflow collects roots of runs that have saved nothing yet."""
    Checkpointer(str(tmp_path / "ckpt")).close()
    assert gc(str(tmp_path / "ckpt"), "best=acc:max:1").delete_steps == []


def test_gc_at_a_given_clock_records_its_health_event(tmp_path, caplog):
    """gc's duration was `time.time() - now`: with `now` given two hours ahead (as the retention
    tests and the adversary's clock do) it was negative, the event was refused (`duration_s`)
    and the health log lost every gc run made at a given time."""
    from ckptflow.core import health
    from ckptflow.core.storage import Storage

    root = str(tmp_path / "root")
    save_steps(root, [1, 2, 3])
    gc(root, "last=1", apply=True, now=time.time() + 2 * HOUR)
    assert "not recorded" not in caplog.text
    events, damaged = health.read_events(Storage(root))
    runs = [e for e in events if e.kind == "gc"]
    assert damaged == 0 and len(runs) == 1 and 0 <= runs[0].duration_s < 60, runs

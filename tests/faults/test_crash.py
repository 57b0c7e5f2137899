"""Crashes: SIGKILL the saving process at every phase of a save, sync and async, local and S3.

After each crash the previous checkpoint is still the newest valid one and loads bitwise, the
partial save is invisible to `latest`/`load` (a torn commit marker, which only the stricter
than real S3 case can leave, is skipped with a warning),
and `gc` removes every leftover of the crashed save, after which the root holds exactly the
objects the surviving checkpoint needs.
"""

from __future__ import annotations

import logging
import time

import pytest
from ckptflow.steps.checkpoint import Checkpointer

from ckptflow.core import layout, rootreader
from ckptflow.core.gc import gc
from ckptflow.core.storage import Storage
from tests.faults import harness
from tests.steps import ckpt_helpers as h


def _prepare(root: str) -> dict:
    """A root with one committed checkpoint (step 1); returns the state it holds."""
    good = harness.crash_state(1)
    Checkpointer(root, threads=2).save(1, good, metadata={"note": "survivor"})
    return good


def _check_survivor(root: str, good: dict, caplog, *, torn: bool) -> None:
    ck = Checkpointer(root)
    assert ck.latest() == 1, "the checkpoint saved before the crash is the newest valid"
    target = h.zeros_like_state(good)
    with caplog.at_level(logging.WARNING, logger="ckptflow.checkpoint"):
        assert ck.load(target) == 1
    h.assert_same(good, target)
    if torn:  # a torn marker is seen, refused, and the fallback is said out loud
        assert [s for s, _ in ck.last_load.fell_back_from] == [2]
        assert "falling back" in caplog.text and layout.COMMIT in ck.last_load.fell_back_from[0][1]
    else:  # the partial save is invisible
        assert ck.committed_steps() == [1] and ck.last_load.fell_back_from == []


def _check_gc_cleans(root: str) -> str:
    st = Storage(root)
    report = gc(root, "last=5", apply=True, grace_s=60, now=time.time() + 120)
    assert 2 in report.leftovers or 2 in report.delete_steps, report.lines()
    ck = Checkpointer(root)
    left = [e.path for e in st.walk(layout.step_dir(2))]
    assert catalog_steps(st) == [1], (
        f"the crashed step's folder is gone; left: {left} {report.lines()}"
    )
    assert set(h.object_files(st)) == {layout.object_path(k) for k in ck.needs(1)}
    ck.verify(1)
    return f"gc removed the step folder and {len(report.objects)} orphan object(s)"


def _detail(phase: str, gc_note: str, s3: bool = False) -> str:
    torn = phase == "during_commit" and s3
    seen = "torn marker refused, fallback logged" if torn else "invisible"
    return f"step 1 loads bitwise; step 2 {seen}; {gc_note}"


def catalog_steps(st: Storage) -> list[int]:
    return sorted(rootreader.step_names(st))


def _crash(root: str, phase: str, block: bool) -> None:
    code = harness.run_forked(
        harness.save_then_maybe_die,
        root,
        phase,
        2,
        harness.crash_state(2),
        block,
    )
    assert code == -9, f"the child should have been SIGKILLed at {phase}, exit code {code}"


@pytest.mark.parametrize("block", [True, False], ids=["sync", "async"])
@pytest.mark.parametrize("phase", list(harness.PHASES))
def test_crash_local(tmp_path, phase, block, caplog, fault):
    root = str(tmp_path / "ckpt")
    good = _prepare(root)
    _crash(root, phase, block)
    _check_survivor(root, good, caplog, torn=False)  # local markers are created atomically
    note = _check_gc_cleans(root)
    kind = "sync" if block else "async"
    fault("crash", f"{harness.PHASES[phase]}; {kind} save, local disk", detail=_detail(phase, note))


# Every S3 case costs seconds against moto: one runs by default, the other nine with -m slow.
_S3_DEFAULT = {("during_commit", False)}
_S3_CASES = [
    pytest.param(
        phase,
        block,
        id=f"{phase}-{'sync' if block else 'async'}",
        marks=() if (phase, block) in _S3_DEFAULT else pytest.mark.slow,
    )
    for phase in harness.PHASES
    for block in (True, False)
]


@pytest.mark.s3
@pytest.mark.parametrize(("phase", "block"), _S3_CASES)
def test_crash_s3(s3_bucket, phase, block, caplog, fault):
    root = f"s3://{s3_bucket}/run/ckpt"
    good = _prepare(root)
    _crash(root, phase, block)
    _check_survivor(root, good, caplog, torn=phase == "during_commit")
    note = _check_gc_cleans(root)
    kind = "sync" if block else "async"
    fault("crash", f"{harness.PHASES[phase]}; {kind} save, S3", detail=_detail(phase, note, True))


def test_one_rank_of_three_killed_mid_save(tmp_path, caplog, fault):
    root = str(tmp_path / "ckpt")
    assert harness.run_ranks(3, harness.ranks_save, root, 1, None) == [0, 0, 0]
    codes = harness.run_ranks(3, harness.ranks_save, root, 2, 1)
    assert codes[1] == -9 and all(c != 0 for c in codes), codes
    ck = Checkpointer(root)
    assert ck.committed_steps() == [1] and ck.latest() == 1
    expected = {}
    for rank in range(3):
        expected.update(harness.rank_state(rank, 1))
    target = h.zeros_like_state(expected)
    assert ck.load(target) == 1 and ck.last_load.fell_back_from == []
    h.assert_same(expected, target)
    assert ck.manifest(1)["world_size"] == 3
    note = _check_gc_cleans(root)
    fault(
        "crash",
        "SIGKILL of rank 1 of 3 in the middle of its data files (others torn down)",
        detail=_detail("mid_data", note),
    )

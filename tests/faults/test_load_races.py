"""A load of the newest step racing a new commit and GC (issue 37, defect 2).

The race is forced, not hoped for: the loader's storage commits a newer step and runs GC (which
deletes the step being read) right before its N-th read of a manifest, an object or a commit
marker. The loader must return the newest intact step there was when it started or a newer
one, and never report as damage what a deletion did.
"""

from __future__ import annotations

import time

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer

from ckptflow.core import runroot
from ckptflow.core.gc import gc
from ckptflow.core.storage import Storage
from tests.faults.adversary.storage import RaceStorage
from tests.steps import ckpt_helpers as h


def _state(v: float) -> dict:
    return {"w": torch.full((64, 64), v), "b": torch.full((8,), v), "step": int(v)}


def _root(where: str, tmp_path) -> str:
    return str(tmp_path / "ckpt") if where == "local" else h.memory_root("load-race")


def _commit_and_collect(root: str, step: int):
    """Commit `step` from another writer, then GC keeping the newest (and pinned) steps only:
    every unpinned older step is deleted, the one being read among them."""

    def act() -> None:
        ck = Checkpointer("unused", storage=Storage(root), threads=2)
        ck.save(step, _state(float(step)))
        ck.close()
        gc(root, "last=1", apply=True, grace_s=0, now=time.time() + 60, storage=Storage(root))

    return act


@pytest.mark.parametrize(
    "where,kind,at",
    [
        ("local", "manifest", 0),
        ("local", "object", 0),
        ("local", "object", 1),
        ("memory", "manifest", 0),
        ("memory", "object", 0),
        ("memory", "COMMIT", 0),
    ],
)
def test_load_newest_deleted_under_it_loads_the_newer_step(where, kind, at, tmp_path):
    root = _root(where, tmp_path)
    ck = Checkpointer(root, threads=2)
    ck.save(1, _state(1.0))
    ck.save(2, _state(2.0))
    ck.close()
    runroot.pin(Storage(root), 1, "kept for the race")  # the older step a wrong fallback finds
    racing = RaceStorage(root, at, {kind}, _commit_and_collect(root, 3))
    loader = Checkpointer("unused", storage=racing, threads=2)
    target = {"w": torch.zeros(64, 64), "b": torch.zeros(8), "step": 0}
    got = loader.load(target)
    loader.close()
    assert racing.fired, f"no {kind} read {at} happened: the race was not run"
    assert Checkpointer(root).committed_steps() == [1, 3]  # step 2 was deleted under the read
    assert got == 3, f"load() returned step {got} although step 3 is committed and intact"
    assert torch.equal(target["w"], torch.full((64, 64), 3.0)) and target["step"] == 3
    assert loader.last_load.fell_back_from == [], "a deletion was reported as damage"

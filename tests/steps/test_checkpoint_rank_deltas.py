"""Delta saves with per-rank manifests (format 5, issue 36): `full_every > 1` is the pipeline's
default, so a delta falling back to one manifest made three saves in four pay rank 0's
O(ranks x tensors) manifest. Each rank's deltas are against its own last full save, held in its
own memory, and its rank manifest names the base objects it references: nothing of another
rank is needed. Round trips bitwise at the saved world size and resharded, GC keeps the bases."""

from __future__ import annotations

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer

from ckptflow.core import rootreader
from ckptflow.core.gc import gc
from ckptflow.core.storage import Storage
from tests.steps import distworkers as dw

STEPS = (1, 2, 3, 4)  # full_every=3: full, delta, delta, full


def save_worker(rank, world, root, ref_path):
    model, opt = dw.build(True, seed=0)
    ck = Checkpointer(root, manifests="rank", full_every=3)
    refs = {}
    for step in STEPS:
        dw.train(model, opt, 1)
        ck.save(step, dw.sharded_state(model, opt))
        refs[step] = dw.full_state(model, opt)  # (collective: every rank)
    ck.close()
    if rank == 0:
        torch.save(refs, ref_path)


def load_worker(rank, world, root, step, out_path):
    from torch.distributed.checkpoint.state_dict import set_state_dict

    model, opt = dw.build(True, seed=99)
    dw.train(model, opt, 1)
    sd = dw.sharded_state(model, opt)
    assert Checkpointer(root).load(sd, step=step) == step
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    got = dw.full_state(model, opt)
    if rank == 0:
        torch.save(got, out_path)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("deltas")
    root, ref = str(d / "ckpt"), str(d / "ref.pt")
    dw.spawn(2, save_worker, root, ref)
    return root, torch.load(ref)


def _assert_bitwise(got: dict, ref: dict) -> None:
    assert set(got) == set(ref)
    for k in ref:
        assert got[k].dtype == ref[k].dtype and torch.equal(got[k], ref[k]), k


def test_delta_saves_write_rank_manifests_against_each_ranks_own_base(saved):
    root, _ = saved
    st = Storage(root)
    for step, kind, base in (
        (1, "full", None),
        (2, "delta", 1),
        (3, "delta", 1),
        (4, "full", None),
    ):
        assert rootreader.read_commit(st, step)["format_version"] == 5, step
        index, _ = rootreader.read_index(st, step)
        assert (index["kind"], index["base_step"]) == (kind, base), step
    merged = rootreader.read_manifest(st, 3)
    based = [p for rec in merged["items"].values() for p in rec["parts"] if p["base"]]
    assert based, "step 3 stored no part as a delta"
    assert all(p["base"]["object"] in merged["objects"] for p in based)


@pytest.mark.parametrize("world", [2, 1])
def test_a_delta_step_loads_bitwise_at_the_saved_world_size_and_resharded(saved, tmp_path, world):
    root, refs = saved
    out = str(tmp_path / "got.pt")
    dw.spawn(world, load_worker, root, 3, out)
    _assert_bitwise(torch.load(out), refs[3])


def test_gc_keeps_the_full_step_a_kept_delta_is_based_on(saved, tmp_path):
    import shutil

    root = str(tmp_path / "copy")
    shutil.copytree(saved[0], root)
    gc(root, "last=2", apply=True, grace_s=0)  # keeps 3 (delta) and 4: 3 needs 1, 2 goes
    assert rootreader.committed_steps(Storage(root)) == [1, 3, 4]
    out = str(tmp_path / "got.pt")
    dw.spawn(2, load_worker, root, 3, out)
    _assert_bitwise(torch.load(out), saved[1][3])


@pytest.mark.parametrize("forged", [None, 2])
def test_an_index_forging_a_deltas_base_step_is_refused_naming_it(tmp_path, forged):
    """A self-consistent index (COMMIT's checksum rewritten) whose base_step disagrees with its
    rank manifests' would make retention keep the wrong base: the merge refuses it."""
    from ckptflow.core.errors import CorruptCheckpoint
    from tests.steps import ckpt_helpers as h

    ck = Checkpointer(str(tmp_path / "r"), manifests="rank", full_every=3)
    for step in (1, 2, 3):
        ck.save(step, {"w": torch.arange(64.0) + step})
    st = Storage(ck.root)
    assert rootreader.read_index(st, 3)[0]["base_step"] == 1

    def forge(m):
        m["base_step"] = forged

    h.rewrite_manifest(st, 3, forge)
    with pytest.raises(CorruptCheckpoint, match="step-00000003"):
        rootreader.read_manifest(st, 3)

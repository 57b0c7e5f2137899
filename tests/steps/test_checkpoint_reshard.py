"""Resharding: a checkpoint saved by N FSDP2 ranks loads bitwise into M ranks or one process."""

from __future__ import annotations

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer, StateDictMismatch
from torch.distributed.checkpoint.state_dict import set_state_dict

from tests.steps import distworkers as dw

EXTRA = {"step": 7, "sched": {"last_epoch": 7, "lrs": [0.1, 0.05]}, "data": (3, 1024)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Checkpoints written by 2 and by 4 FSDP2 ranks, with their full reference state."""
    out = {}
    for n in (2, 4):
        d = tmp_path_factory.mktemp(f"saved{n}")
        root, ref = str(d / "ckpt"), str(d / "ref.pt")
        dw.spawn(n, dw.save_worker, root, ref, 3, EXTRA)
        out[n] = (root, torch.load(ref))
    return out


def _assert_bitwise(got: dict, ref: dict) -> None:
    assert set(got) == set(ref)
    for k in ref:
        assert got[k].dtype == ref[k].dtype, k
        assert torch.equal(got[k], ref[k]), f"{k} differs after the round trip"


@pytest.mark.parametrize(("n", "m"), [(2, 3), (4, 2), (4, 1)])
def test_reshard_n_to_m(saved, tmp_path, n, m):
    root, ref = saved[n]
    out = str(tmp_path / "out.pt")
    dw.spawn(m, dw.load_worker, root, out)
    res = torch.load(out)
    assert res["step"] == 3
    _assert_bitwise(res["state"], ref)
    assert res["extra"] == EXTRA


def test_load_into_plain_process_without_distributed(saved):
    root, ref = saved[4]
    model, opt = dw.build(False, seed=5)
    dw.train(model, opt, 1)
    sd = {**dw.sharded_state(model, opt), "extra": dw.extra_template()}
    assert Checkpointer(root).load(sd) == 3
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    _assert_bitwise(dw.full_state(model, opt), ref)
    assert sd["extra"] == EXTRA


def test_manifest_records_world_size_and_per_rank_values(saved):
    root, _ = saved[4]
    m = Checkpointer(root).manifest(3)
    assert m["world_size"] == 4
    assert {f"rng/rank{r}" for r in range(4)} <= set(m["tensors"])
    assert {"extra.step", "extra.sched.last_epoch", "extra.data"} <= set(m["values"])


def test_shape_mismatch_lists_differences(saved):
    root, _ = saved[2]
    sd = {
        "model": {
            "l1.weight": torch.zeros(8, 13),
            "l2.weight": torch.zeros(5, 7),
            "nope": torch.zeros(1),
        }
    }
    with pytest.raises(StateDictMismatch) as ei:
        Checkpointer(root).load(sd)
    msg = str(ei.value)
    assert "model.nope" in msg and "model.l1.weight: model [8, 13] vs checkpoint [7, 13]" in msg

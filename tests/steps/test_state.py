"""The training state through the Checkpointer in one process: exact resume."""

from __future__ import annotations

import torch
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.lib import state as st

from tests.steps import training_setup as ts

dinfo = ts.dinfo


def test_resume_through_the_checkpointer_is_bitwise_exact_with_dropout(dinfo, tmp_path):
    reference = ts.make(dinfo)
    ts.steps(reference, 12, dinfo)

    first = ts.make(dinfo)
    ts.steps(first, 6, dinfo)
    ck = Checkpointer(str(tmp_path / "ckpt"))
    state = st.train_state(*first, step=6)
    state.update(st.rng_entry(dinfo.rank, dinfo.device))
    ck.save(6, state, metadata={"world_size": 1}).wait()
    ts.steps(first, 2, dinfo)  # work after the checkpoint that the "kill" loses

    resumed = ts.make(dinfo)
    torch.manual_seed(1234)  # a different RNG: only the restored one can reproduce dropout
    start = st.resume(Checkpointer(str(tmp_path / "ckpt")), *resumed, dinfo)
    assert start == 6 and resumed[3].position == 6 * 4
    ts.steps(resumed, 6, dinfo)
    ref, got = ts.params(reference[0]), ts.params(resumed[0])
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    assert resumed[2].last_epoch == reference[2].last_epoch == 12
    # the same resume without the saved RNG state diverges: dropout really depends on it
    other = ts.make(dinfo)
    torch.manual_seed(1234)
    Checkpointer(str(tmp_path / "ckpt")).load(st.train_state(*other, step=0))
    ts.steps(other, 6, dinfo)
    assert not all(torch.equal(ref[k], v) for k, v in ts.params(other[0]).items())


def test_resume_of_an_empty_root_starts_at_zero(dinfo, tmp_path):
    assert st.resume(Checkpointer(str(tmp_path / "none")), *ts.make(dinfo), dinfo) == 0

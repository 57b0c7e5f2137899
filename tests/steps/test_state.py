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


def test_init_from_another_checkpoint_weights_or_full_state(dinfo, tmp_path):
    """--init-from: `weights` fills only the model (the step stays 0), `full` the whole state
    (optimizer, scheduler, data position, step), reporting what was loaded."""
    source = ts.make(dinfo, dropout=0.0)
    ts.steps(source, 4, dinfo)
    full = _full(st.train_state(*source, step=4))
    torch.save(full, tmp_path / "src.pt")
    ref = ts.params(source[0])

    fresh = ts.make(dinfo, dropout=0.0)
    ck = Checkpointer(str(tmp_path / "ckpt"))
    assert st.init_from(ck, fresh, str(tmp_path / "src.pt"), "weights", dinfo) == 0
    assert all(torch.equal(ref[k], v) for k, v in ts.params(fresh[0]).items())
    assert fresh[3].position == 0 and ck.last_init.kind == "torch"
    assert any(k.startswith("optim.") for k in ck.last_init.unused)

    full = ts.make(dinfo, dropout=0.0)
    assert st.init_from(ck, full, str(tmp_path / "src.pt"), "full", dinfo) == 4
    assert full[3].position == source[3].position and full[2].last_epoch == 4
    ts.steps(full, 2, dinfo)
    ts.steps(source, 2, dinfo)  # the same optimizer state: the same next steps
    got, want = ts.params(full[0]), ts.params(source[0])
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert ck.committed_steps() == []


def _full(obj):
    """The state with every DTensor as its full tensor (a torch.save file holds plain ones)."""
    if hasattr(obj, "full_tensor"):
        return obj.full_tensor()
    if isinstance(obj, dict):
        return {k: _full(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_full(v) for v in obj]
    return obj

"""Training pieces in one process (a gloo group of one): schedule, steps, state, exact resume."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.lib import training as tr
from ckptflow.steps.lib.data import Corpus, ShardedLoader
from ckptflow.steps.lib.model import config_for


@pytest.fixture(scope="module")
def dinfo():
    torch.set_num_threads(1)
    info = tr.init_distributed()
    assert (info.rank, info.world_size) == (0, 1)
    yield info
    tr.shutdown_distributed()


def make(dinfo, *, dropout=0.1, total=12):
    """A fresh tiny training setup (always the same initial weights)."""
    tr.set_deterministic(0)
    model = tr.build_model(config_for("tiny", seq_len=32, dropout=dropout), dinfo, seed=0)
    opt = tr.make_optimizer(model, 3e-3)
    sched = tr.make_scheduler(opt, 3, total)
    loader = ShardedLoader(Corpus("add", 0), seq_len=32, global_batch=4, grad_accum=2)
    return model, opt, sched, loader


def params(model) -> dict:
    return {k: v.full_tensor().clone() for k, v in model.state_dict().items()}


def steps(setup, n, dinfo):
    model, opt, sched, loader = setup
    return [tr.train_step(model, opt, sched, loader.next_step(), dinfo.device) for _ in range(n)]


def test_warmup_then_cosine_decay():
    lr = [tr.warmup_cosine(s, 4, 20, 0.1) for s in range(21)]
    assert lr[:4] == [0.25, 0.5, 0.75, 1.0]
    assert lr[4] == 1.0 and abs(lr[20] - 0.1) < 1e-12
    assert all(a >= b for a, b in zip(lr[4:], lr[5:], strict=False))


def test_training_lowers_validation_loss(dinfo):
    setup = make(dinfo, dropout=0.0, total=30)
    corpus = Corpus("add", 0)
    before = tr.evaluate(setup[0], corpus, seq_len=32, n_batches=2, n_exact=8)
    log = steps(setup, 30, dinfo)
    after = tr.evaluate(setup[0], corpus, seq_len=32, n_batches=2, n_exact=8)
    assert after["val_loss"] < before["val_loss"] - 0.5
    assert log[-1]["train_loss"] < log[0]["train_loss"]
    assert {"train_loss", "lr", "grad_norm"} <= set(log[0])
    assert 0.0 <= after["exact_match"] <= 1.0


def test_evaluate_loss_is_the_mean_token_cross_entropy(dinfo):
    model = make(dinfo)[0]
    corpus = Corpus("add", 0)
    got = tr.evaluate(model, corpus, seq_len=32, n_batches=2, batch_size=4, n_exact=4)
    x, y = corpus.batch("validation", range(8), 32)
    with torch.no_grad():
        logits = model.eval()(x)
    want = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    assert got["val_loss"] == pytest.approx(float(want), rel=1e-5)
    assert got == tr.evaluate(model, corpus, seq_len=32, n_batches=2, batch_size=4, n_exact=4)


def test_rng_state_round_trip(dinfo):
    saved = tr.rng_state(dinfo.device)
    a = (torch.rand(3), random.random(), np.random.rand())
    tr.set_rng_state(saved, dinfo.device)
    b = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(a[0], b[0]) and a[1:] == b[1:]


def test_resume_through_the_checkpointer_is_bitwise_exact_with_dropout(dinfo, tmp_path):
    reference = make(dinfo)
    steps(reference, 12, dinfo)

    first = make(dinfo)
    steps(first, 6, dinfo)
    ck = Checkpointer(str(tmp_path / "ckpt"))
    state = tr.train_state(*first, step=6)
    state.update(tr.rng_entry(dinfo.rank, dinfo.device))
    ck.save(6, state, metadata={"world_size": 1}).wait()
    steps(first, 2, dinfo)  # work after the checkpoint that the "kill" loses

    resumed = make(dinfo)
    torch.manual_seed(1234)  # a different RNG: only the restored one can reproduce dropout
    start = tr.resume(Checkpointer(str(tmp_path / "ckpt")), *resumed, dinfo)
    assert start == 6 and resumed[3].position == 6 * 4
    steps(resumed, 6, dinfo)
    ref, got = params(reference[0]), params(resumed[0])
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    assert resumed[2].last_epoch == reference[2].last_epoch == 12
    # the same resume without the saved RNG state diverges: dropout really depends on it
    other = make(dinfo)
    torch.manual_seed(1234)
    Checkpointer(str(tmp_path / "ckpt")).load(tr.train_state(*other, step=0))
    steps(other, 6, dinfo)
    assert not all(torch.equal(ref[k], v) for k, v in params(other[0]).items())


def test_resume_of_an_empty_root_starts_at_zero(dinfo, tmp_path):
    assert tr.resume(Checkpointer(str(tmp_path / "none")), *make(dinfo), dinfo) == 0

"""The optimizer side of training in one process: schedule, steps that lower the loss."""

from __future__ import annotations

from ckptflow.steps.lib import optim
from ckptflow.steps.lib.data import Corpus
from ckptflow.steps.lib.evaluation import evaluate

from tests.steps import training_setup as ts

dinfo = ts.dinfo


def test_warmup_then_cosine_decay():
    lr = [optim.warmup_cosine(s, 4, 20, 0.1) for s in range(21)]
    assert lr[:4] == [0.25, 0.5, 0.75, 1.0]
    assert lr[4] == 1.0 and abs(lr[20] - 0.1) < 1e-12
    assert all(a >= b for a, b in zip(lr[4:], lr[5:], strict=False))


def test_training_lowers_validation_loss(dinfo):
    setup = ts.make(dinfo, dropout=0.0, total=30)
    corpus = Corpus("add", 0)
    before = evaluate(setup[0], corpus, seq_len=32, n_batches=2, n_exact=8)
    log = ts.steps(setup, 30, dinfo)
    after = evaluate(setup[0], corpus, seq_len=32, n_batches=2, n_exact=8)
    assert after["val_loss"] < before["val_loss"] - 0.5
    assert log[-1]["train_loss"] < log[0]["train_loss"]
    assert {"train_loss", "lr", "grad_norm"} <= set(log[0])
    assert 0.0 <= after["exact_match"] <= 1.0

"""Evaluation of a model on fixed validation data (one process)."""

from __future__ import annotations

import pytest
import torch
from ckptflow.steps.lib.data import Corpus
from ckptflow.steps.lib.evaluation import evaluate

from tests.steps import training_setup as ts

dinfo = ts.dinfo


def test_evaluate_loss_is_the_mean_token_cross_entropy(dinfo):
    model = ts.make(dinfo)[0]
    corpus = Corpus("add", 0)
    got = evaluate(model, corpus, seq_len=32, n_batches=2, batch_size=4, n_exact=4)
    x, y = corpus.batch("validation", range(8), 32)
    with torch.no_grad():
        logits = model.eval()(x)
    want = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    assert got["val_loss"] == pytest.approx(float(want), rel=1e-5)
    assert got == evaluate(model, corpus, seq_len=32, n_batches=2, batch_size=4, n_exact=4)

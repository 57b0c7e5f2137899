"""A tiny training setup in one process (a gloo group of one), shared by the training tests."""

from __future__ import annotations

import pytest
import torch
from ckptflow.steps.lib import distributed, optim, rng
from ckptflow.steps.lib.data import Corpus, ShardedLoader
from ckptflow.steps.lib.model import config_for


@pytest.fixture(scope="module")
def dinfo():
    torch.set_num_threads(1)
    info = distributed.init_distributed()
    assert (info.rank, info.world_size) == (0, 1)
    yield info
    distributed.shutdown_distributed()


def make(dinfo, *, dropout=0.1, total=12):
    """A fresh tiny training setup (always the same initial weights)."""
    rng.set_deterministic(0)
    model = distributed.build_model(config_for("tiny", seq_len=32, dropout=dropout), dinfo, seed=0)
    opt = optim.make_optimizer(model, 3e-3)
    sched = optim.make_scheduler(opt, 3, total)
    loader = ShardedLoader(Corpus("add", 0), seq_len=32, global_batch=4, grad_accum=2)
    return model, opt, sched, loader


def params(model) -> dict:
    return {k: v.full_tensor().clone() for k, v in model.state_dict().items()}


def steps(setup, n, dinfo):
    model, opt, sched, loader = setup
    return [optim.train_step(model, opt, sched, loader.next_step(), dinfo.device) for _ in range(n)]

"""Every RNG of a process: its state round-trips."""

from __future__ import annotations

import random

import numpy as np
import torch
from ckptflow.steps.lib import rng

from tests.steps import training_setup as ts

dinfo = ts.dinfo


def test_rng_state_round_trip(dinfo):
    saved = rng.rng_state(dinfo.device)
    a = (torch.rand(3), random.random(), np.random.rand())
    rng.set_rng_state(saved, dinfo.device)
    b = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(a[0], b[0]) and a[1:] == b[1:]

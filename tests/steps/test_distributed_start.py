"""A slow start on rank 0 is not taken for a lost peer (`distributed.start_barrier`).

How it failed in CI: rank 0 alone opens the MLflow run before training; on a loaded host that
took 17 s, while rank 1, already in its first collective, gave up after `pg_timeout_s` (5 s),
exited PEER_LOST_EXIT and took the gang down before the first step. Here rank 0's opening of
its run is made slower than the process-group timeout: both ranks must still train and exit 0.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from ckptflow.steps import pretrain
from ckptflow.steps.lib import distributed, plumbing

from tests.steps import distworkers as dw

PG_TIMEOUT_S = 2
SLOW_START_S = 3 * PG_TIMEOUT_S


def _slow_rank0(port: int, rank: int, root: str) -> None:
    """pretrain.main on one rank; rank 0's MLflow run opens SLOW_START_S late."""
    dw.rank_env(rank, 2, port)
    if rank == 0:
        opened = plumbing._open_lineage

        def slow(*args, **kwargs):
            time.sleep(SLOW_START_S)  # a busy tracking server, a fresh sqlite database
            return opened(*args, **kwargs)

        plumbing._open_lineage = slow
    argv = [
        "--run-root", root, "--max-steps", "2", "--ckpt-every", "2", "--batch-size", "2",
        "--seq-len", "8", "--preflight-factor", "0", "--pg-timeout-s", str(PG_TIMEOUT_S),
    ]  # fmt: skip
    dw.exit_with(pretrain.main, argv)


def test_a_rank_0_slower_to_start_than_the_pg_timeout_does_not_fail_the_gang(tmp_path):
    ctx = mp.get_context("spawn")
    port = dw.free_port()
    root = str(tmp_path / "run")
    procs = [ctx.Process(target=_slow_rank0, args=(port, r, root)) for r in (0, 1)]
    assert dw.run_all(procs, timeout=240) == [0, 0]


class _Store:
    """The two calls of a c10d store the barrier makes, counted (one rank's view)."""

    def __init__(self, arrived: int):
        self.arrived, self.keys, self.waited = arrived, {}, None

    def add(self, key, n):
        self.arrived += n
        return self.arrived

    def set(self, key, value):
        self.keys[key] = value

    def wait(self, keys, timeout):
        self.waited = (keys, timeout)


@pytest.mark.parametrize("arrived, last", [(0, False), (1, True)])
def test_the_last_rank_to_arrive_releases_the_others_under_the_start_timeout(arrived, last):
    store = _Store(arrived)
    info = distributed.DistInfo(rank=1, world_size=2, local_rank=1, device=None)
    distributed.start_barrier(info, 600, store=store)
    assert bool(store.keys) is last
    assert store.waited == ([distributed._ALL_STARTED], timedelta(seconds=600))


def test_a_lone_rank_does_not_wait():
    store = _Store(0)
    distributed.start_barrier(distributed.DistInfo(0, 1, 0, None), 600, store=store)
    assert store.waited is None and not dist.is_initialized()

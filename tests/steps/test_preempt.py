"""Preemption saves (issue 18): ranks agree at a step boundary that one of them got SIGTERM,
all save that step, and exit PREEMPTED_EXIT; the resumed run starts there.

The agreement protocol on three gloo processes (no training), then `ckptflow.steps.pretrain`
on two forked ranks (as torchrun would start them) with a SIGTERM to rank 1 mid-training.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from ckptflow.steps import pretrain
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.lib.preempt import PREEMPTED_EXIT, PreemptionFlag
from mlflow import MlflowClient

from tests.steps import distworkers as dw


def _agreement_worker(rank: int, world: int, port: int, out: str, signal_at: int) -> None:
    dw.rank_env(rank, world, port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    flag = PreemptionFlag()
    flag.install()
    agreed = None
    for step in range(1, 9):
        if rank == 1 and step == signal_at:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets the flag
        time.sleep(0.02 * rank)  # the ranks reach each boundary at different times
        if flag.agree():
            agreed = step
            break
    flag.uninstall()
    Path(out, f"rank{rank}.json").write_text(json.dumps({"agreed": agreed, "local": flag.local}))
    dist.destroy_process_group()
    os._exit(0)


def _launch(world: int, target, *args) -> list:
    """`world` processes target(rank, world, port, *args) from a fork server that imported
    torch and the steps once (a fork each, not an interpreter start-up)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    port = dw.free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, *args)) for r in range(world)]
    for p in procs:
        p.start()
    return procs


def _wait(procs, timeout: float = 240) -> list[int]:
    for p in procs:
        p.join(timeout)
        if p.is_alive():
            p.kill()
    return [p.exitcode for p in procs]


def _results(out: Path, world: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def test_every_rank_learns_of_one_ranks_sigterm_at_the_same_step_boundary(tmp_path):
    assert _wait(_launch(3, _agreement_worker, str(tmp_path), 3)) == [0, 0, 0]
    got = _results(tmp_path, 3)
    assert [g["agreed"] for g in got] == [3, 3, 3]  # all stop after the same step
    assert [g["local"] for g in got] == [False, True, False]  # only rank 1 was signalled


def test_without_a_signal_no_rank_stops(tmp_path):
    assert _wait(_launch(2, _agreement_worker, str(tmp_path), 0)) == [0, 0]
    assert [g["agreed"] for g in _results(tmp_path, 2)] == [None, None]


# -- the training loop ------------------------------------------------------------------------
STEPS, EVERY = 60, 25
TRAIN = ["--model", "tiny", "--max-steps", str(STEPS), "--ckpt-every", str(EVERY)]
TRAIN += ["--batch-size", "8", "--seq-len", "32", "--warmup-steps", "3", "--seed", "0"]


def _rank(rank: int, world: int, port: int, argv: list[str]) -> None:
    dw.rank_env(rank, world, port)
    dw.exit_with(pretrain.main, argv)


@pytest.mark.timeout(480)
def test_a_sigterm_to_one_rank_commits_the_step_reached_and_the_resume_starts_there(tmp_path):
    root = str(tmp_path / "run")
    os.makedirs(root)
    MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db").search_experiments()
    argv = ["--run-root", root, *TRAIN]
    procs = _launch(2, _rank, argv)
    first = Path(root, "ckpt", f"step-{EVERY:08d}", "COMMIT")
    deadline = time.monotonic() + 200
    while not first.exists():  # training is past its first periodic checkpoint
        assert time.monotonic() < deadline and all(p.is_alive() for p in procs)
        time.sleep(0.05)
    os.kill(procs[1].pid, signal.SIGTERM)  # as torchrun's agent forwards a preemption
    assert _wait(procs) == [PREEMPTED_EXIT] * 2
    ck = Checkpointer(f"{root}/ckpt")
    steps = ck.committed_steps()
    reached = steps[-1]
    assert steps[0] == EVERY and EVERY < reached < STEPS, steps  # saved on the way out
    meta = ck.manifest(reached)["metadata"]
    assert meta["data"]["position"] == reached * 8  # the data position of the step reached
    assert not Path(root, "FINISHED").exists()
    assert _wait(_launch(2, _rank, argv)) == [0, 0]  # the retry
    assert ck.committed_steps() == [*steps, *(s for s in (50, 60) if s > reached)]
    assert json.loads(Path(root, "FINISHED").read_text())["last_step"] == STEPS

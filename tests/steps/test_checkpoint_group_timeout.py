"""A background save whose peer is lost fails within the process group's timeout (issue 34).

The Checkpointer runs async saves over a gloo group of its own. torch's `new_group` does not
inherit the default group's timeout (it takes gloo's 30 min), so a save in flight when a
peer's node went silent held the survivor: its collective waited 30 min, and the interpreter's
exit waited for that save thread, although the training loop had already left with
PEER_LOST_EXIT (the gang's restart then waited on the survivor; found by
tests/workflows/test_isolation_gang_node_loss.py, where torchrun had to SIGKILL it).
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.steps.distworkers import free_port, rank_env

TIMEOUT_S = 3
SLACK_S = 20  # a loaded machine: the op in flight, the failed save's clean-up


def _worker(rank: int, port: int, root: str, out: str) -> None:
    """Both ranks commit one save; then rank 1 stops taking part (as a frozen node's rank
    does) and rank 0 saves in the background and waits for that save."""
    from ckptflow.steps.checkpoint import Checkpointer

    rank_env(rank, 2, port)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=TIMEOUT_S))
    ck = Checkpointer(root)
    state = {"w": torch.arange(16.0)}
    ck.save(1, state, block=False).wait()  # both: the checkpointer's own group is made
    if rank == 1:
        time.sleep(TIMEOUT_S + SLACK_S + 30)  # lost: never takes part again
        os._exit(0)
    ck.save(2, state, block=False)
    start = time.monotonic()
    try:
        ck.close()
        outcome = "finished"
    except Exception as exc:  # the save failed: what a lost peer must give
        outcome = f"failed: {type(exc).__name__}"
    with open(out, "w") as fh:
        json.dump({"waited_s": time.monotonic() - start, "outcome": outcome}, fh)
    os._exit(0)


def test_a_background_save_fails_within_the_group_timeout_when_a_peer_is_lost(tmp_path):
    ctx = mp.get_context("spawn")
    port, out = free_port(), tmp_path / "rank0.json"
    root = str(tmp_path / "ckpt")
    procs = [ctx.Process(target=_worker, args=(r, port, root, str(out))) for r in (0, 1)]
    for p in procs:
        p.start()
    procs[0].join(120 + TIMEOUT_S + SLACK_S)
    for p in procs:
        p.kill()
        p.join()
    assert out.exists(), "rank 0's background save did not end (it waits gloo's 30 min)"
    got = json.loads(out.read_text())
    assert got["outcome"].startswith("failed"), got
    assert got["waited_s"] < TIMEOUT_S + SLACK_S, got

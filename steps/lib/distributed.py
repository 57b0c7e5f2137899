"""Where this process sits in the job: the process group (torchrun's, or a group of one), a
step's lifecycle on every rank (`ranked_step_run`), and the model built identically on every
rank and sharded with FSDP2.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from ckptflow.steps.lib import preempt
from ckptflow.steps.lib.lineage import run_label
from ckptflow.steps.lib.model import GPT, ModelConfig
from ckptflow.steps.lib.plumbing import StepRun, step_run
from torch.distributed.fsdp import fully_shard

from ckptflow import env


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


# How long the ranks wait for each other at the end of their start-up. Rank 0 alone opens the
# MLflow run first (a fresh sqlite database or a busy tracking server: tens of seconds on a loaded
# host); a rank already in its first collective would take that for a lost peer after
# `pg_timeout_s` and fail the whole gang before training began. torchrun's own rendezvous waits
# 600 s by default (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py, join timeout).
START_TIMEOUT_S = 600.0
_STARTED, _ALL_STARTED = "ckptflow/started", "ckptflow/all-started"

# Exit code of a rank whose collective failed (a peer lost, frozen or gone): the rank template's
# retryStrategy retries it like any failure, so every rank of the gang comes back (issue 34).
PEER_LOST_EXIT = 4


def init_distributed(timeout_s: float | None = None) -> DistInfo:
    """Join the torchrun job (nccl on GPU, gloo on CPU), or form a group of one when run plainly.

    A one-process group keeps FSDP2 and the collective Checkpointer on the same code path.
    `timeout_s` bounds every collective and the store's waits: without it a peer lost silently
    (a node gone: no FIN, no RST) hangs the survivors for gloo's 30 min (NCCL's 10 min).
    """
    cuda = torch.cuda.is_available()
    info = env.torchrun_rank_info()
    rank, world, local = info if info else (0, 1, 0)
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "nccl" if cuda else "gloo"
        timeout = {"timeout": timedelta(seconds=timeout_s)} if timeout_s else {}
        if info:
            dist.init_process_group(backend, device_id=device if cuda else None, **timeout)
        else:
            dist.init_process_group(
                backend, store=dist.HashStore(), rank=0, world_size=1, **timeout
            )
    return DistInfo(dist.get_rank(), dist.get_world_size(), local, device)


def start_barrier(dinfo: DistInfo, timeout_s: float, store=None) -> None:
    """Wait until every rank has finished its start-up, up to `timeout_s` (not the
    process-group timeout): a count and a flag in the group's store, whose waits take their
    own timeout. torchrun makes a fresh store for every restart of the gang
    (torch/distributed/rendezvous.py `_create_c10d_store`), so the keys start anew with it.
    A rank 0 gone meanwhile closes the store: the wait raises at once (RuntimeError)."""
    if dinfo.world_size == 1:
        return
    # the store init_process_group made; torch has no public accessor for it
    store = store or dist.distributed_c10d._get_default_store()
    if store.add(_STARTED, 1) == dinfo.world_size:
        store.set(_ALL_STARTED, "1")
    store.wait([_ALL_STARTED], timedelta(seconds=timeout_s))


def _peer_lost(log: logging.Logger, dinfo: DistInfo, exc: RuntimeError, timeout_s) -> None:
    """One line for a rank whose collective failed, then PEER_LOST_EXIT (no traceback)."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    log.error(
        "rank %d of %d: a collective failed (a peer lost, frozen or gone; pg_timeout_s=%s): "
        "%s; exiting %d so the whole gang restarts from the newest valid checkpoint",
        dinfo.rank, dinfo.world_size, timeout_s, first, PEER_LOST_EXIT,
    )  # fmt: skip
    raise SystemExit(PEER_LOST_EXIT)


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def ranked_step_run(kind: str, cfg, log) -> Iterator[tuple[DistInfo, StepRun]]:
    """`plumbing.step_run` for a step that runs on every rank of a job: joins the process group
    first and leaves it last; rank 0 alone records the MLflow run and writes the outputs.

    SIGTERM is caught from the start (a preemption: the training loop saves and leaves).
    Collectives time out after `cfg.pg_timeout_s`; in a group of several ranks a failed one
    (torch raises RuntimeError, gloo's timeout included) ends this rank with one line and
    PEER_LOST_EXIT, so a lost peer costs the survivors a bounded wait, not a hang. The ranks
    first wait for each other after rank 0 opened its MLflow run (`start_barrier`), under the
    longer START_TIMEOUT_S, so a slow start is not taken for a lost peer."""
    preempt.FLAG.install()
    timeout_s = getattr(cfg, "pg_timeout_s", None)
    dinfo = init_distributed(timeout_s)
    try:
        # named after its run root (`finetune-lr0.001-freeze1`): the variants differ by name
        name = run_label(kind, getattr(cfg, "run_root", ""))
        with step_run(kind, cfg, log, rank=dinfo.rank, main=dinfo.is_main, run_name=name) as run:
            start_barrier(dinfo, max(START_TIMEOUT_S, timeout_s or 0))
            yield dinfo, run
    except RuntimeError as exc:
        if dinfo.world_size == 1:
            raise  # a lone rank has no peer to lose: a real error keeps its traceback
        _peer_lost(log, dinfo, exc, timeout_s)
    finally:
        shutdown_distributed()
        preempt.FLAG.uninstall()


def build_model(cfg: ModelConfig, dinfo: DistInfo, seed: int, *, shard: bool = True) -> GPT:
    """The same initial weights on every rank (seeded), sharded block by block with FSDP2."""
    torch.manual_seed(seed)
    model = GPT(cfg).to(dinfo.device)
    if shard:
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    return model

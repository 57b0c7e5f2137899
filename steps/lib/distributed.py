"""Where this process sits in the job: the process group (torchrun's, or a group of one), a
step's lifecycle on every rank (`ranked_step_run`), and the model built identically on every
rank and sharded with FSDP2.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

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


def init_distributed() -> DistInfo:
    """Join the torchrun job (nccl on GPU, gloo on CPU), or form a group of one when run plainly.

    A one-process group keeps FSDP2 and the collective Checkpointer on the same code path.
    """
    cuda = torch.cuda.is_available()
    info = env.torchrun_rank_info()
    rank, world, local = info if info else (0, 1, 0)
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "nccl" if cuda else "gloo"
        if info:
            dist.init_process_group(backend, device_id=device if cuda else None)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return DistInfo(dist.get_rank(), dist.get_world_size(), local, device)


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def ranked_step_run(kind: str, cfg, log) -> Iterator[tuple[DistInfo, StepRun]]:
    """`plumbing.step_run` for a step that runs on every rank of a job: joins the process group
    first and leaves it last; rank 0 alone records the MLflow run and writes the outputs.

    SIGTERM is caught from the start (a preemption: the training loop saves and leaves)."""
    preempt.FLAG.install()
    dinfo = init_distributed()
    try:
        # named after its run root (`finetune-lr0.001-freeze1`): the variants differ by name
        name = run_label(kind, getattr(cfg, "run_root", ""))
        with step_run(kind, cfg, log, rank=dinfo.rank, main=dinfo.is_main, run_name=name) as run:
            yield dinfo, run
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

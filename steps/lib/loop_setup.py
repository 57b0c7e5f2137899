"""What the checkpointed training loop (loop.py) trains, `TrainObjects`, and how, `LoopSpec`:
both built from a pretrain or fine-tune config, whose loop fields are the same in both. Kept
apart from the loop so that what the loop is given, and how a config becomes it, read in one
place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from ckptflow.steps.lib.data import Corpus, ShardedLoader
from ckptflow.steps.lib.distributed import DistInfo
from ckptflow.steps.lib.optim import make_optimizer, make_scheduler
from ckptflow.steps.lib.straggler import StragglerSpec

__all__ = ["LoopSpec", "TrainObjects"]


@dataclass(frozen=True)
class LoopSpec:
    """How the loop runs: length, checkpoint cadence, logging, and the kill hook for tests."""

    max_steps: int
    ckpt_every: int
    async_save: bool = True
    log_every: int = 1
    grad_clip: float = 1.0
    tokens_per_step: int = 0
    fail_at_step: int | None = None
    straggler: StragglerSpec = StragglerSpec(every=0)

    @classmethod
    def from_config(cls, cfg, seq_len: int) -> LoopSpec:
        """The loop settings of a pretrain or fine-tune config (the same fields in both)."""
        return cls(
            max_steps=cfg.max_steps,
            ckpt_every=cfg.ckpt_every,
            async_save=cfg.async_save,
            log_every=cfg.log_every,
            grad_clip=cfg.grad_clip,
            tokens_per_step=cfg.batch_size * seq_len,
            fail_at_step=cfg.fail_at_step or None,
            straggler=StragglerSpec.from_config(cfg),
        )


class TrainObjects(NamedTuple):
    """The live objects a training state is made of: `state.train_state(*objs, step=...)`."""

    model: Any
    optimizer: Any
    scheduler: Any
    loader: ShardedLoader

    @classmethod
    def from_config(cls, cfg, model, corpus: Corpus, seq_len: int, dinfo: DistInfo) -> TrainObjects:
        """AdamW with warm-up and cosine decay, and this rank's loader, as a pretrain or fine-tune
        config names them (the same fields in both)."""
        optimizer = make_optimizer(model, cfg.lr, cfg.weight_decay)
        scheduler = make_scheduler(optimizer, cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio)
        loader = ShardedLoader(
            corpus,
            seq_len=seq_len,
            global_batch=cfg.batch_size,
            grad_accum=cfg.grad_accum,
            rank=dinfo.rank,
            world_size=dinfo.world_size,
        )
        return cls(model, optimizer, scheduler, loader)

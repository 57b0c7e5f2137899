"""Multi-rank workers for the local tier's save tests (tests/steps/test_tier_save*.py): the tiny
FSDP2 GPT's training state (steps/lib/state.train_state) saved by LocalTier, then loaded by
each rank from ONLY its own rank root."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import torch
import torch.distributed as dist
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.checkpoint.tier.local_save import LocalTier
from ckptflow.steps.lib import distributed, optim
from ckptflow.steps.lib.data import Corpus, ShardedLoader
from ckptflow.steps.lib.model import config_for
from ckptflow.steps.lib.state import apply_train_state, rng_entry, train_state

from ckptflow.core import tier
from ckptflow.core.storage import Storage

DURABLE = "s3://bucket/run/ckpt"


def setup(rank: int, world: int, seed: int = 0):
    """The tiny GPT (FSDP2 over the gang), AdamW, its schedule and this rank's loader."""
    dinfo = distributed.DistInfo(rank, world, rank, torch.device("cpu"))
    model = distributed.build_model(config_for("tiny", seq_len=32), dinfo, seed=seed)
    opt = optim.make_optimizer(model, 3e-3)
    sched = optim.make_scheduler(opt, 3, 20)
    loader = ShardedLoader(
        Corpus("add", 0), seq_len=32, global_batch=4, grad_accum=1, rank=rank, world_size=world
    )
    return dinfo, (model, opt, sched, loader)


def train(objs, dinfo, n: int) -> None:
    model, opt, sched, loader = objs
    for _ in range(n):
        optim.train_step(model, opt, sched, loader.next_step(), dinfo.device)


def flat(state: dict, prefix: str = "") -> dict:
    """Every leaf of a (nested) state as a comparable value: tensors as local CPU clones."""
    out = {}
    for k, v in state.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat(v, key + "."))
        elif isinstance(v, torch.Tensor):
            t = v.to_local() if hasattr(v, "to_local") else v
            out[key] = t.detach().cpu().clone()
        else:
            out[key] = v
    return out


def _eq(x, y) -> bool:
    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)
    if isinstance(x, np.ndarray):
        return isinstance(y, np.ndarray) and x.dtype == y.dtype and np.array_equal(x, y)
    if isinstance(x, list | tuple):
        return type(x) is type(y) and len(x) == len(y) and all(map(_eq, x, y))
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(_eq(x[k], y[k]) for k in x)
    return type(x) is type(y) and x == y


def same(a: dict, b: dict) -> list[str]:
    """Keys whose values differ (or are in one only)."""
    return sorted(set(a) ^ set(b)) + sorted(k for k in set(a) & set(b) if not _eq(a[k], b[k]))


def save_and_load_alone(rank, world, local_dir, out_dir, steps=(2, 4)):
    """LocalTier saves of `steps`; every rank then loads the last step from its own root only
    (a Checkpointer not cooperative, never reading another root) into a fresh state, and
    reports whether it equals the saved state, its piece and its root's files."""
    dinfo, objs = setup(rank, world)
    lt = LocalTier(local_dir, tier.run_key(DURABLE), rank, world, keep=2)
    saved = None
    for step in steps:
        train(objs, dinfo, 2)
        state = train_state(*objs, step)
        state.update(rng_entry(rank, dinfo.device))
        lt.save(step, state, metadata={"data": objs[3].state_dict()})
        saved = flat(state)  # the live values at the save (training waits here)
    lt.close()
    root = tier.piece_root(local_dir, tier.run_key(DURABLE), rank)
    alone = os.path.join(out_dir, f"alone-{rank}")
    dist.barrier()
    shutil.copytree(root, alone)  # this rank's root alone: no other root is there to read
    dist.barrier()
    if rank == 0:
        shutil.rmtree(local_dir)
    dist.barrier()
    piece = tier.read_piece(Storage(alone), steps[-1], rank)
    _, fresh = setup(rank, world, seed=7)
    train(fresh, dinfo, 1)  # other values, optimizer state allocated
    got = train_state(*fresh, 0)
    got.update(rng_entry(rank, dinfo.device))
    root = alone
    before = same(saved, flat(got))
    ck = Checkpointer(root, cooperative=False)
    loaded = ck.load(got, step=steps[-1])
    step = apply_train_state(got, *fresh)
    diff = same(saved, flat(got))
    report = {
        "rank": rank,
        "loaded": loaded,
        "step": step,
        "diff": diff,
        "keys": len(saved),
        "differed_before": len(before),
        "piece": None if piece is None else [piece.step, piece.rank, len(piece.objects)],
        "problem": None if piece is None else tier.verify_piece(ck.storage, piece),
        "steps": ck.committed_steps(),
        "bytes_read": ck.last_load.bytes_read,
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)


def plain_state(rank: int, step: int) -> dict:
    """A small state of this rank's own tensors and shared values (no model: fast)."""
    g = torch.Generator().manual_seed(rank * 1000 + step)
    return {
        f"r{rank}.w": torch.randn(64, 64, generator=g),
        f"r{rank}.big": torch.randn(512, 512, generator=g),  # 1 MiB: an object of its own
        "shared": {"step": step, "lr": torch.full((4,), 0.5 * step)},
    }


def one_rank_fails_worker(rank, world, local_dir, out_dir):
    """Steps 2, 4, 6, 8: at 4 rank 1 cannot write its PIECE, at 6 no rank can write what it
    receives (DCP gives the shared items to one rank: the other receives them); the gang goes
    on (no collective left waiting) and both ranks' later pieces are complete. Reports each
    rank's complete steps, its tier's failures and whether it received at step 6."""
    from ckptflow.steps.checkpoint.tier import fanout, local_retention

    lt = LocalTier(local_dir, tier.run_key(DURABLE), rank, world, keep=4)
    real_piece, real_transfer = tier.write_piece, fanout.FanOut._transfer

    def piece(st, p):
        if rank == 1 and p.step == 4:
            raise OSError("PIECE refused on purpose")
        return real_piece(st, p)

    def refuse(rel, data, **kw):
        raise OSError(f"{rel} refused on purpose")

    received = []

    def transfer(self, src, keys, sizes, missing, found):  # at step 6 nothing received lands
        if self.job.step == 6 and set(keys) & set(missing):
            received.append(6)
            self.st.write = refuse
        try:
            return real_transfer(self, src, keys, sizes, missing, found)
        finally:
            self.st.__dict__.pop("write", None)

    tier.write_piece, fanout.FanOut._transfer = piece, transfer
    for step in (2, 4, 6, 8):
        lt.save(step, plain_state(rank, step))
        lt.settle()
    lt.close()
    report = {
        "rank": rank,
        "complete": sorted(local_retention.complete_steps(lt.storage, rank)),
        "failures": lt.failures,
        "enabled": lt.enabled,
        "received": received,
    }
    with open(os.path.join(out_dir, f"fail{rank}.json"), "w") as f:
        json.dump(report, f)


def damaged_sender_worker(rank, world, local_dir, out_dir):
    """Step 2: what the holder of the shared items sends is damaged on the way (every byte
    flipped): the receiver refuses it (its key does not match) and has no piece; the sender's
    own piece is complete. Step 4: both complete."""
    from ckptflow.steps.checkpoint.tier import fanout, local_retention

    lt = LocalTier(local_dir, tier.run_key(DURABLE), rank, world, keep=4)
    real_transfer = fanout.FanOut._transfer
    sent = []

    def transfer(self, src, keys, sizes, missing, found):
        if self.job.step == 2 and self.rank == src:
            sent.append(src)
            real_read = self.st.read
            self.st.read = lambda rel, limit=None: bytes(b ^ 0xFF for b in real_read(rel))
        try:
            return real_transfer(self, src, keys, sizes, missing, found)
        finally:
            self.st.__dict__.pop("read", None)

    fanout.FanOut._transfer = transfer
    for step in (2, 4):
        lt.save(step, plain_state(rank, step))
        lt.settle()
    lt.close()
    report = {
        "complete": sorted(local_retention.complete_steps(lt.storage, rank)),
        "failures": lt.failures,
        "why": lt.last_failure,
        "sent": sent,
    }
    with open(os.path.join(out_dir, f"damaged{rank}.json"), "w") as f:
        json.dump(report, f)

"""Training pieces shared by pretrain and finetune: process group, FSDP2, AdamW with warmup and
cosine decay, one optimizer step with gradient accumulation, the full training state as one
nested dict for the Checkpointer (model, optimizer, scheduler, data position, step, every
rank's RNG), and evaluation (validation loss and exact match).

Everything here is deterministic for a given seed and world size: model init is seeded on
every rank, the data is a function of the position, and each rank's RNG state is saved under
a rank-qualified key (`rng/rank{r}/...`) so a resume replays the same dropout masks.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from ckptflow.steps.lib import env
from ckptflow.steps.lib.data import Corpus, ShardedLoader, decode, encode
from ckptflow.steps.lib.model import GPT, ModelConfig
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard

log = logging.getLogger("ckptflow.training")


# -- process group -------------------------------------------------------------------------------
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


def set_deterministic(seed: int) -> None:
    """Seed every RNG and ask for deterministic kernels (bitwise-equal resume needs both)."""
    env.prepare_deterministic_cuda()
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    if torch.cuda.is_available():
        # CPU kernels used here are deterministic already; this call imports torch._dynamo
        # (seconds of start-up), so it is made only where it matters.
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False


# -- model and optimizer -------------------------------------------------------------------------
def build_model(cfg: ModelConfig, dinfo: DistInfo, seed: int, *, shard: bool = True) -> GPT:
    """The same initial weights on every rank (seeded), sharded block by block with FSDP2."""
    torch.manual_seed(seed)
    model = GPT(cfg).to(dinfo.device)
    if shard:
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    return model


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float = 0.1):
    """AdamW; matrices decay, biases, norms and embeddings do not (the usual GPT recipe)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.ndim >= 2 and "emb" not in name else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def warmup_cosine(step: int, warmup: int, total: int, min_ratio: float = 0.1) -> float:
    """LR multiplier: linear warm-up to 1 over `warmup` steps, then cosine down to `min_ratio`."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_scheduler(optimizer, warmup: int, total: int, min_ratio: float = 0.1):
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: warmup_cosine(s, warmup, total, min_ratio)
    )


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def train_step(model, optimizer, scheduler, micro_batches, device, grad_clip: float = 1.0) -> dict:
    """One optimizer step over this rank's micro-batches; gradients sync on the last one only.

    Returns the job-wide mean loss, the gradient norm and the learning rate used.
    """
    model.train()
    optimizer.zero_grad(set_to_none=True)
    n = len(micro_batches)
    total = torch.zeros((), device=device)
    for i, (x, y) in enumerate(micro_batches):
        if hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(i == n - 1)  # skip reduce-scatter until the last
        _, loss = model(x.to(device), y.to(device))
        (loss / n).backward()
        total += loss.detach() / n
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip) if grad_clip > 0 else None
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    scheduler.step()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total, op=dist.ReduceOp.AVG)  # for the log only
    out = {"train_loss": float(total), "lr": float(lr)}
    if norm is not None:
        out["grad_norm"] = float(_local(norm))
    return out


# -- RNG state -----------------------------------------------------------------------------------
def rng_state(device: torch.device) -> dict:
    """This process's RNG states: torch CPU, CUDA (when used), Python `random`, numpy."""
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(torch.as_tensor(state["torch"], dtype=torch.uint8).cpu())
    version, internal, gauss = state["python"]
    random.setstate((int(version), tuple(int(v) for v in internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state(
        (str(kind), np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached))
    )
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(torch.as_tensor(state["cuda"], dtype=torch.uint8).cpu(), device)


# -- the training state as one dict --------------------------------------------------------------
def train_state(model, optimizer, scheduler, loader: ShardedLoader, step: int) -> dict:
    """Everything a resume needs, except RNG (see `rng_entry`): nested dict for ck.save/ck.load."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {
        "model": model_sd,
        "optim": optim_sd,
        "scheduler": scheduler.state_dict(),
        "data": loader.state_dict(),
        "step": step,
    }


def rng_entry(rank: int, device: torch.device) -> dict:
    """This rank's RNG states under its rank-qualified key: {"rng": {"rank{r}": {...}}}."""
    return {"rng": {f"rank{rank}": rng_state(device)}}


def apply_train_state(state: dict, model, optimizer, scheduler, loader: ShardedLoader) -> int:
    """Push a loaded training state into the live objects; returns its step."""
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    scheduler.load_state_dict(state["scheduler"])
    loader.load_state_dict(state["data"])
    return int(state["step"])


def model_state_template(model) -> dict:
    """{"model": ...} alone: what the evaluator and a fine-tune load from a checkpoint."""
    return {"model": get_model_state_dict(model, options=StateDictOptions())}


# -- evaluation ----------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(
    model: GPT,
    corpus: Corpus,
    *,
    seq_len: int,
    n_batches: int = 4,
    batch_size: int = 16,
    n_exact: int = 64,
    device: torch.device | None = None,
) -> dict:
    """Validation loss on fixed validation samples and exact match on fixed prompts.

    The same samples for every checkpoint, so the numbers are comparable across steps.
    """
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    losses = []
    for b in range(n_batches):
        x, y = corpus.batch("validation", range(b * batch_size, (b + 1) * batch_size), seq_len)
        losses.append(float(model(x.to(device), y.to(device))[1]))
    problems = corpus.exact_match_set(n_exact)
    correct = 0
    # prompts of a task have a fixed width, but group by length so any task batches correctly
    by_len: dict[tuple[int, int], list[tuple[str, str]]] = {}
    for p, a in problems:
        by_len.setdefault((len(p), len(a)), []).append((p, a))
    for (_, n_ans), group in by_len.items():
        ids = torch.tensor([encode(p) for p, _ in group], device=device)
        out = model.generate(ids, n_ans)[:, ids.shape[1] :]
        correct += sum(decode(row.tolist()) == a for row, (_, a) in zip(out, group, strict=True))
    model.train(was_training)
    return {
        "val_loss": sum(losses) / len(losses),
        "exact_match": correct / max(1, len(problems)),
    }


# -- resume and the checkpointed loop (shared by pretrain and finetune) ---------------------------
KILLED_EXIT = 75  # exit code of a simulated kill (--fail-at-step)


class SimulatedKill(Exception):
    """Raised at --fail-at-step in a plain (non-torchrun) process; torchrun ranks hard-exit."""


def resume(ck, model, optimizer, scheduler, loader, dinfo: DistInfo, lineage=None) -> int:
    """Load the newest valid checkpoint (model, optimizer, scheduler, data, RNG); its step or 0.

    The Checkpointer falls back past a corrupt newest checkpoint; that is logged and tagged.
    RNG states are loaded in a second, small load because which ranks saved one depends on
    the world size of that checkpoint; ranks beyond it keep their seeded RNG.
    """
    if not ck.committed_steps():
        return 0
    state = train_state(model, optimizer, scheduler, loader, 0)
    step = ck.load(state)
    fell = [s for s, _ in ck.last_load.fell_back_from] if ck.last_load else []
    apply_train_state(state, model, optimizer, scheduler, loader)
    saved_world = int(ck.manifest(step).get("world_size", 1))
    rng = rng_entry(dinfo.rank, dinfo.device) if dinfo.rank < saved_world else {}
    ck.load(rng, step=step)
    if rng:
        set_rng_state(rng["rng"][f"rank{dinfo.rank}"], dinfo.device)
    log.info(
        "resumed from step %d (saved by %d ranks, now %d)", step, saved_world, dinfo.world_size
    )
    if fell and dinfo.is_main:
        log.warning("newest checkpoint(s) %s are corrupt: resumed from step %d instead", fell, step)
    if lineage is not None:
        tags = {"ckptflow.resumed_from_step": step, "ckptflow.resume_world_size": saved_world}
        if fell:
            tags["ckptflow.resume_fell_back_from"] = ",".join(map(str, fell))
        lineage.set_tags(tags)
    return step


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


class CheckpointedLoop:
    """Train to `max_steps`, saving every `ckpt_every` steps (and at the end) with metadata.

    Each save first creates a PENDING LoggedModel (rank 0) whose id goes into the checkpoint's
    metadata; once the save is committed the model is finalised with its manifest hash and
    sizes, and the save metrics are logged at that step.
    """

    def __init__(
        self,
        spec: LoopSpec,
        *,
        model,
        optimizer,
        scheduler,
        loader,
        ck,
        dinfo: DistInfo,
        lineage=None,
        metadata: dict | None = None,
    ):
        self.spec, self.model, self.optimizer = spec, model, optimizer
        self.scheduler, self.loader, self.ck, self.dinfo = scheduler, loader, ck, dinfo
        self.lineage = lineage if dinfo.is_main else None
        self.metadata = metadata or {}
        self.pending: list[tuple] = []
        self.skip: set[int] = set()
        self.last_metrics: dict = {}

    def run(self, start_step: int) -> int:
        from ckptflow.steps.lib.plumbing import Progress

        # Steps above the resume point are committed only when resume fell back past them as
        # corrupt; checkpoints are immutable, so those saves are skipped (and said so).
        self.skip = {s for s in self.ck.committed_steps() if s > start_step}

        progress = Progress(self.spec.max_steps, enabled=self.dinfo.is_main)
        for step in range(start_step, self.spec.max_steps):
            t0 = time.perf_counter()
            m = train_step(
                self.model,
                self.optimizer,
                self.scheduler,
                self.loader.next_step(),
                self.dinfo.device,
                self.spec.grad_clip,
            )
            dt = time.perf_counter() - t0
            m.update(step_time_s=dt, tokens_per_s=self.spec.tokens_per_step / max(dt, 1e-9))
            done, self.last_metrics = step + 1, m
            if self.lineage and done % self.spec.log_every == 0:
                self.lineage.log_metrics(m, done)
            progress.update(done, m)
            if self.spec.fail_at_step == done:
                self._die(done)
            if done % self.spec.ckpt_every == 0 or done == self.spec.max_steps:
                self.save(done)
            self._reap(block=False)
        self._reap(block=True)
        progress.close()
        return self.spec.max_steps

    def _die(self, step: int) -> None:
        log.warning("--fail-at-step %d: exiting without cleanup, as if killed", step)
        if env.torchrun_rank_info() is not None:
            logging.shutdown()
            os._exit(KILLED_EXIT)
        raise SimulatedKill(step)

    def save(self, step: int) -> None:
        uri = self.ck.storage.url(f"step-{step:08d}")
        if step in self.skip:
            log.warning(
                "not saving step %d: a corrupt checkpoint of that step exists (%s); "
                "remove it with `ckptflow ckpt gc` to save there again",
                step,
                uri,
            )
            return
        model_id = self.lineage.begin_checkpoint(step, uri) if self.lineage else None
        state = train_state(self.model, self.optimizer, self.scheduler, self.loader, step)
        state.update(rng_entry(self.dinfo.rank, self.dinfo.device))
        meta = {
            **self.metadata,
            "data": self.loader.state_dict(),
            "world_size": self.dinfo.world_size,
            "metrics": self.last_metrics,
            "mlflow": {
                "model_id": model_id,
                "run_id": self.lineage.run_id if self.lineage else None,
            },
        }
        try:
            handle = self.ck.save(step, state, block=not self.spec.async_save, metadata=meta)
        except Exception as exc:
            if self.lineage:
                self.lineage.fail_checkpoint(model_id, str(exc))
            raise
        self.pending.append((handle, step, uri, model_id))

    def _reap(self, block: bool) -> None:
        """Finish the saves that are done (all when `block`): lineage for committed ones."""
        while self.pending and (block or self.pending[0][0].done()):
            handle, step, uri, model_id = self.pending.pop(0)
            try:
                stats = handle.wait()
            except Exception as exc:
                if self.lineage:
                    self.lineage.fail_checkpoint(model_id, str(exc))
                raise
            log.info(
                "checkpoint %d committed: %s stall %.3fs, background %.3fs, %d bytes written",
                step,
                stats.kind,
                stats.stall_s,
                stats.background_s,
                stats.bytes_written,
            )
            if self.lineage:
                self._log_committed(step, uri, model_id, stats)

    def _log_committed(self, step: int, uri: str, model_id: str | None, stats) -> None:
        from ckptflow.core import rootreader

        m = self.ck.manifest(step)
        digest = rootreader.read_commit(self.ck.storage, step)["manifest_xxh3"]
        sizes = {"kind": m["kind"], "world_size": m["world_size"], **m["stats"]}
        self.lineage.log_checkpoint(step, uri, digest, sizes, model_id=model_id)
        self.lineage.log_metrics(
            {
                "save_stall_s": stats.stall_s,
                "save_background_s": stats.background_s,
                "save_wait_s": stats.wait_s,
                "save_bytes_raw": stats.bytes_raw,
                "save_bytes_written": stats.bytes_written,
                "save_gib_per_s": stats.gib_per_s,
                "ckpt_stored_bytes": m["stats"]["stored_bytes"],
            },
            step,
        )


def check_loop_args(parser, cfg) -> None:
    """Reject loop settings a user can get wrong (task name, step counts) with parser.error."""
    from ckptflow.steps.lib.data import check_task

    try:
        check_task(cfg.task)
    except ValueError as exc:
        parser.error(f"--task: {exc}")
    if cfg.max_steps < 1 or cfg.ckpt_every < 1:
        parser.error("--max-steps and --ckpt-every must be at least 1")

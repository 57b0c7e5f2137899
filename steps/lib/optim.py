"""The optimizer side of training: AdamW with warmup and cosine decay, and one optimizer step
with gradient accumulation.
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist


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

    Returns the job-wide mean loss, the gradient norm, the learning rate used and the time of
    the optimizer update (`optim_s`: no collective in it, so ranks can be compared on it).
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
    start = time.perf_counter()
    optimizer.step()  # no collective: each rank updates its own shard
    scheduler.step()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)  # else only the kernel launches are timed
    optim_s = time.perf_counter() - start
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total, op=dist.ReduceOp.AVG)  # for the log only
    out = {"train_loss": float(total), "lr": float(lr), "optim_s": optim_s}
    if norm is not None:
        out["grad_norm"] = float(_local(norm))
    return out

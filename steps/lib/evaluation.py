"""Evaluation of a model on fixed validation data: validation loss and exact match."""

from __future__ import annotations

import torch
from ckptflow.steps.lib.data import Corpus, decode, encode
from ckptflow.steps.lib.model import GPT


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

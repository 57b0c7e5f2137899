"""Evaluation of a model on fixed validation data (validation loss and exact match), and the
fine-tune's record of an evaluated step: `eval.json` next to its checkpoint (what
`ckptflow.steps.select` reads), its metrics linked to the checkpoint's MLflow LoggedModel.
"""

from __future__ import annotations

import logging
import time

import torch
from ckptflow.steps.lib.data import Corpus, decode, encode
from ckptflow.steps.lib.model import GPT

from ckptflow.core import runroot
from ckptflow.core.layout import step_dir

log = logging.getLogger("ckptflow.finetune")


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


def fmt(metrics: dict) -> str:
    return " ".join(f"{k} {v:.4f}" for k, v in metrics.items())


class Recorder:
    """Writes a step's eval.json (rank 0 only) and links its metrics to its LoggedModel."""

    def __init__(self, ck, task: str, lineage, base_metrics: dict):
        self.ck, self.task, self.lineage, self.base_metrics = ck, task, lineage, base_metrics

    def __call__(self, step: int, metrics: dict, model_id: str | None) -> None:
        if self.lineage is None:  # not the main rank
            return
        if model_id:
            self.lineage.log_metrics(metrics, step, model_id=model_id)
        record = runroot.EvalRecord(
            step=step,
            status="ok",
            metrics=metrics,
            task=self.task,
            base_metrics=self.base_metrics,
            model_id=model_id,
            mlflow_run_id=self.lineage.run_id,
            uri=self.ck.storage.url(step_dir(step)),
            evaluated_at=time.time(),
            evaluator="ckptflow.steps.finetune",
        )
        runroot.write_eval(self.ck.storage, record)
        log.info("step %d on %s: %s", step, self.task, fmt(metrics))

"""The fine-tune's training loop: the pretraining loop plus an evaluation of each checkpoint.

Each saved step is evaluated on the fine-tune task right away, by every rank (FSDP2 gathers
parameters collectively), while the model is still at that step; once the checkpoint is
committed, rank 0 writes the result next to it as `eval.json` (what `ckptflow.steps.select` reads) and
links the metrics to the checkpoint's MLflow LoggedModel, which also gets the base's tags.
"""

from __future__ import annotations

import json
import logging
import time

from ckptflow.steps.lib import lineage as lin
from ckptflow.steps.lib.loop import CheckpointedLoop

from ckptflow.core.layout import EVAL, step_dir

log = logging.getLogger("ckptflow.finetune")


def fmt(metrics: dict) -> str:
    return " ".join(f"{k} {v:.4f}" for k, v in metrics.items())


def base_tags(base) -> dict:
    """Tags naming the base checkpoint (LoggedModel id and URI) and the pretraining run."""
    tags = {"ckptflow.base_ckpt_uri": base.uri, "ckptflow.base_step": base.step}
    if base.model_id:
        tags["ckptflow.base_model_id"] = base.model_id
    if base.run_id:
        tags["ckptflow.base_run_id"] = base.run_id
    return tags


class Recorder:
    """Writes a step's eval.json (rank 0 only) and links its metrics to its LoggedModel."""

    def __init__(self, ck, task: str, lineage, base_metrics: dict):
        self.ck, self.task, self.lineage, self.base_metrics = ck, task, lineage, base_metrics

    def __call__(self, step: int, metrics: dict, model_id: str | None) -> None:
        if self.lineage is None:  # not the main rank
            return
        if model_id:
            self.lineage.log_metrics(metrics, step, model_id=model_id)
        record = {
            "step": step,
            "status": "ok",
            "metrics": metrics,
            "task": self.task,
            "base_metrics": self.base_metrics,
            "model_id": model_id,
            "mlflow_run_id": self.lineage.run_id,
            "uri": self.ck.storage.url(step_dir(step)),
            "evaluated_at": time.time(),
            "evaluator": "ckptflow.steps.finetune",
        }
        self.ck.storage.write(f"{step_dir(step)}/{EVAL}", json.dumps(record, indent=1).encode())
        log.info("step %d on %s: %s", step, self.task, fmt(metrics))


class FinetuneLoop(CheckpointedLoop):
    """`CheckpointedLoop` + evaluation of each saved step + the base's tags on each model."""

    def __init__(self, *args, evaluate, write_eval, base, **kw):
        super().__init__(*args, **kw)
        self.evaluate_now, self.write_eval, self.base = evaluate, write_eval, base
        self.results: dict[int, dict] = {}

    def save(self, step: int) -> None:
        super().save(step)
        if step not in self.skip:
            self.results[step] = self.evaluate_now()  # every rank: the model is at `step` now

    def _reap(self, block: bool) -> None:
        before = {p[1]: p[3] for p in self.pending}  # step -> model_id of saves in flight
        super()._reap(block)
        left = {p[1] for p in self.pending}
        for step, model_id in before.items():
            if step not in left and step in self.results:  # committed just now
                self.write_eval(step, self.results.pop(step), model_id)

    def _log_committed(self, step, uri, model_id, stats) -> None:
        super()._log_committed(step, uri, model_id, stats)
        if model_id and self.lineage:
            tags, client = lin.scrub(base_tags(self.base)), self.lineage.client
            self.lineage._call(
                "tag logged model", lambda: client.set_logged_model_tags(model_id, tags)
            )

"""A run's evaluation results as stored: `eval.json` files next to its checkpoints.

`eval.json` files (written next to each checkpoint by `ckptflow.steps.evaluate` or
`ckptflow.steps.finetune`) are the one source of metrics: `--base-step best:METRIC` and
`ckptflow.steps.select` rank steps with them, never with values passed through Argo.
"""

from __future__ import annotations

import logging

from ckptflow import env
from ckptflow.core import layout, rootreader, runroot
from ckptflow.core.storage import Storage

log = logging.getLogger("ckptflow.eval_results")


def ckpt_storage(uri: str) -> Storage:
    """The checkpoint root of `uri`: a run root (its `ckpt/`) or a checkpoint root itself."""
    st = env.open_storage(uri)
    if st.exists(layout.ROOT_MARKER):
        return st
    return runroot.ckpt_root(st)


def direction(metric: str, mode: str = "") -> str:
    """'min' or 'max' for a metric: `mode` when given, else min for losses, max otherwise."""
    if mode:
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be min or max, got {mode!r}")
        return mode
    return "min" if "loss" in metric.lower() else "max"


def better(a: float, b: float, mode: str) -> bool:
    """True when value `a` is strictly better than `b` in direction `mode`."""
    return a < b if mode == "min" else a > b


def read_evals(ckpt: Storage) -> dict[int, runroot.EvalRecord]:
    """step -> eval record, for every committed step that has one (unreadable ones skipped,
    with a warning naming the file)."""
    problems: list[str] = []
    evals = runroot.read_evals(ckpt, rootreader.committed_steps(ckpt), problems)
    for p in problems:
        log.warning("skipping an evaluation record: %s", p)
    return evals


def best_step(
    evals: dict[int, runroot.EvalRecord], metric: str, mode: str
) -> tuple[int, float] | None:
    """(step, value) of the best evaluated step; the earliest step wins a tie."""
    best = None
    for step in sorted(evals):
        value = evals[step].metric(metric)
        if value is not None and (best is None or better(value, best[1], mode)):
            best = (step, value)
    return best


def known_metrics(evals: dict[int, runroot.EvalRecord]) -> list[str]:
    return sorted({k for r in evals.values() for k in r.metrics})

"""A run's evaluation results as stored: `eval.json` files next to its checkpoints.

`eval.json` files (written next to each checkpoint by `ckptflow.steps.evaluate` or
`ckptflow.steps.finetune`) are the one source of metrics: `--base-step best:METRIC` and
`ckptflow.steps.select` rank steps with them, never with values passed through Argo.
"""

from __future__ import annotations

import json

from ckptflow.core import layout, rootreader
from ckptflow.core.storage import Storage


def ckpt_storage(uri: str) -> Storage:
    """The checkpoint root of `uri`: a run root (its `ckpt/`) or a checkpoint root itself."""
    st = Storage(uri)
    if st.exists(layout.ROOT_MARKER):
        return st
    return st.child("ckpt")


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


def read_evals(ckpt: Storage) -> dict[int, dict]:
    """step -> eval.json record, for every committed step that has one (unreadable ones skipped)."""
    out = {}
    for step in rootreader.committed_steps(ckpt):
        try:
            rec = json.loads(ckpt.read(f"{layout.step_dir(step)}/{layout.EVAL}"))
        except (FileNotFoundError, ValueError, UnicodeDecodeError):
            continue
        if isinstance(rec, dict):
            out[step] = rec
    return out


def metric_of(rec: dict, metric: str) -> float | None:
    """The metric of an ok eval record (None for a failed evaluation or a missing metric)."""
    if rec.get("status", "ok") != "ok":
        return None
    value = (rec.get("metrics") or {}).get(metric)
    return float(value) if isinstance(value, int | float) else None


def best_step(evals: dict[int, dict], metric: str, mode: str) -> tuple[int, float] | None:
    """(step, value) of the best evaluated step; the earliest step wins a tie."""
    best = None
    for step in sorted(evals):
        value = metric_of(evals[step], metric)
        if value is not None and (best is None or better(value, best[1], mode)):
            best = (step, value)
    return best


def known_metrics(evals: dict[int, dict]) -> list[str]:
    return sorted({k for r in evals.values() for k in (r.get("metrics") or {})})

"""A run root's names and files: everything a run keeps around its checkpoint root.

    <run>/ckpt/                                  the run's checkpoint root (ckptflow.core.layout)
    <run>/FINISHED                               training finished (JSON); followers stop
    <run>/ckpt/step-<8 digits>/eval.json         the step's evaluation record (`EvalRecord`)
    <run>/ckpt/step-<8 digits>/eval.claim[.N]    an evaluator's claim on the step
    <run>/ckpt/step-<8 digits>/PIN               pinned: never deleted by a policy (JSON reason)
    <run>/export/<variant>-step-<8 digits>-<dtype>/   weights exported from a chosen step

The steps write these files; the ckpt CLI, the steps and the workflows' summary read them, all
through this module. Every file read here may be hostile (foreign, truncated, crafted): reads
are bounded, every field is checked, and a bad file is a `RecordError` naming it and the fix.

Importing this module costs only the standard library (no fsspec, torch or hera): functions
that touch storage are given a `ckptflow.core.storage.Storage`.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from ckptflow.core import jsonfile, layout
from ckptflow.core.errors import CheckpointError

if TYPE_CHECKING:
    from ckptflow.core.storage import Storage

CKPT = "ckpt"
FINISHED = "FINISHED"
EXPORT = "export"
EVAL = "eval.json"
CLAIM = "eval.claim"
PIN = "PIN"

MAX_RECORD = 1 << 20  # bytes of an eval.json or PIN: a few KiB in practice
MAX_METRICS = 1024
MAX_NAME = 256
MAX_TEXT = 4096
MAX_ERROR = 8192
STATUSES = ("ok", "failed")


class RecordError(CheckpointError):
    """A run-root file (eval.json, PIN) is unreadable, too large or malformed."""


# -- names ---------------------------------------------------------------------------------------
def ckpt_uri(run_uri: str) -> str:
    """The checkpoint root URI of a run root."""
    from ckptflow.core.uris import join_uri  # here: the names need no fsspec

    return join_uri(run_uri, CKPT)


def ckpt_root(run: Storage) -> Storage:
    """The checkpoint root of a run root's storage."""
    return run.child(CKPT)


def step_file(step: int, name: str) -> str:
    """A file of a step folder, relative to the checkpoint root."""
    return f"{layout.step_dir(step)}/{name}"


def eval_path(step: int) -> str:
    return step_file(step, EVAL)


def pin_path(step: int) -> str:
    return step_file(step, PIN)


def export_name(variant: str, step: int, dtype: str) -> str:
    """The folder (under an export URI) of the weights exported from `variant`'s `step`."""
    return f"{variant}-{layout.step_dir(step)}-{dtype}"


# -- FINISHED ------------------------------------------------------------------------------------
def finished(run: Storage) -> bool:
    """True once the run's training wrote FINISHED (an evaluator following it then stops)."""
    return run.exists(FINISHED)


def write_finished(run: Storage, doc: dict) -> None:
    run.write(FINISHED, json.dumps(doc).encode())


def clear_finished(run: Storage) -> None:
    """Withdraw FINISHED: training goes on (e.g. --max-steps was raised)."""
    run.delete([FINISHED])


# -- bounded JSON --------------------------------------------------------------------------------
def _read_json(storage: Storage, rel: str, fix: str):
    """The parsed JSON of a small untrusted file; None when absent; RecordError when it is too
    large, not JSON, nested too deep or holds a huge integer (the shared bounded reader)."""
    try:
        return jsonfile.read(storage, rel, max_bytes=MAX_RECORD)
    except FileNotFoundError:
        return None
    except jsonfile.BadJsonFile as exc:
        raise RecordError(f"{exc}; {fix}") from None


def _fail(where: str, key: str, what: str):
    raise RecordError(f"{where}: field {key}: {what}")


def _text(doc: dict, key: str, where: str, limit: int = MAX_TEXT) -> str | None:
    v = doc.get(key)
    if v is not None and not (isinstance(v, str) and len(v) <= limit):
        _fail(where, key, f"expected a string of at most {limit} characters or null")
    return v


def _as_float(v, where: str, key: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        _fail(where, key, f"expected a number, got {type(v).__name__}")
    try:
        return float(v)
    except OverflowError:  # an integer too large for a float
        _fail(where, key, "number out of range")


def _number(doc: dict, key: str, where: str) -> float | None:
    v = doc.get(key)
    return None if v is None else _as_float(v, where, key)


def _metrics(doc: dict, key: str, where: str) -> dict[str, float] | None:
    v = doc.get(key)
    if v is None:
        return None
    if not isinstance(v, dict) or len(v) > MAX_METRICS:
        _fail(where, key, f"expected an object of at most {MAX_METRICS} metrics")
    out = {}
    for name, value in v.items():
        if len(name) > MAX_NAME:
            _fail(where, key, f"metric name longer than {MAX_NAME} characters")
        out[name] = _as_float(value, where, f"{key}.{name}")
    return out


def _evaluator(doc: dict, where: str) -> str | dict | None:
    v = doc.get("evaluator")
    if v is None or (isinstance(v, str) and len(v) <= MAX_NAME):
        return v
    if not isinstance(v, dict) or len(v) > 16:
        _fail(where, "evaluator", "expected a name or a small object")
    for k, x in v.items():
        ok = isinstance(x, str) and len(x) <= MAX_NAME
        if len(k) > MAX_NAME or not (ok or (isinstance(x, int) and not isinstance(x, bool))):
            _fail(where, f"evaluator.{k:.40}", "expected a short string or an integer")
    return dict(v)


# -- evaluation records --------------------------------------------------------------------------
@dataclass(frozen=True)
class EvalRecord:
    """One evaluation of a committed step, stored beside it as eval.json (what `ckpt ls`, the
    fine-tune's `--base-step best:` and select rank steps by)."""

    step: int  # the evaluated step
    status: str = "ok"  # "ok", or "failed" (then `error` says why)
    metrics: dict[str, float] = field(default_factory=dict)  # metric name -> value
    task: str | None = None  # the task evaluated on
    base_metrics: dict[str, float] | None = None  # a fine-tune's base on the same task
    model_id: str | None = None  # MLflow LoggedModel of the checkpoint (null: none)
    mlflow_run_id: str | None = None  # MLflow run that logged the metrics (null: none)
    uri: str | None = None  # the step's URI
    error: str | None = None  # why a failed evaluation failed
    evaluated_at: float | None = None  # when (epoch seconds)
    seconds: float | None = None  # how long the evaluation took
    evaluator: str | dict | None = None  # who: a step's module, or {"host", "pid"}

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def metric(self, name: str) -> float | None:
        """The value of `name` in an ok record (None for a failed one or a missing metric)."""
        return self.metrics.get(name) if self.ok else None

    def to_json(self) -> dict:
        """The eval.json document: None fields are left out, except an ok record's MLflow ids
        (null there says MLflow had none); a failed record carries no empty metrics."""
        keep = ("model_id", "mlflow_run_id") if self.ok else ()
        doc = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if (value is None and f.name not in keep) or (f.name == "metrics" and not self.ok):
                continue
            doc[f.name] = value
        return doc

    @classmethod
    def from_json(cls, doc, where: str, step: int) -> EvalRecord:
        """Check every field of a parsed eval.json of `step` (`where` names the file)."""
        if not isinstance(doc, dict):
            raise RecordError(f"{where}: expected a JSON object")
        got = doc.get("step")
        if isinstance(got, bool) or got != step:
            _fail(where, "step", f"expected {step}, got {str(got)[:40]!r}")
        status = doc.get("status", "ok")  # records written without one were ok
        if status not in STATUSES:
            _fail(where, "status", f"expected one of {', '.join(STATUSES)}")
        return cls(
            step=step,
            status=status,
            metrics=_metrics(doc, "metrics", where) or {},
            task=_text(doc, "task", where),
            base_metrics=_metrics(doc, "base_metrics", where),
            model_id=_text(doc, "model_id", where),
            mlflow_run_id=_text(doc, "mlflow_run_id", where),
            uri=_text(doc, "uri", where),
            error=_text(doc, "error", where, MAX_ERROR),
            evaluated_at=_number(doc, "evaluated_at", where),
            seconds=_number(doc, "seconds", where),
            evaluator=_evaluator(doc, where),
        )


def has_eval(ckpt: Storage, step: int) -> bool:
    """True when `step` has an evaluation record (ok or failed)."""
    return ckpt.exists(eval_path(step))


def read_eval(ckpt: Storage, step: int) -> EvalRecord | None:
    """The evaluation record of `step` under the checkpoint root `ckpt`; None when it has none.
    RecordError (naming the file) when the file is too large, not JSON or malformed."""
    rel = eval_path(step)
    fix = f"delete it to have step {step} evaluated again"
    doc = _read_json(ckpt, rel, fix)
    if doc is None:
        return None
    try:
        return EvalRecord.from_json(doc, ckpt.url(rel), step)
    except RecordError as exc:
        raise RecordError(f"{exc}; {fix}") from None


def read_evals(
    ckpt: Storage, steps: list[int], problems: list[str] | None = None
) -> dict[int, EvalRecord]:
    """step -> record for each of `steps` that has a readable one; a bad record is left out
    (its message goes to `problems`), so one damaged file never hides the other steps."""
    out = {}
    for step in steps:
        try:
            rec = read_eval(ckpt, step)
        except RecordError as exc:
            if problems is not None:
                problems.append(str(exc))
            continue
        if rec is not None:
            out[step] = rec
    return out


def write_eval(ckpt: Storage, record: EvalRecord, exclusive: bool = False) -> None:
    """Store `record` as its step's eval.json (checked first: never write what is refused);
    `exclusive`: only if the step has none yet (AlreadyExists otherwise), so of two evaluators
    of one step exactly one records it."""
    rel = eval_path(record.step)
    doc = record.to_json()
    EvalRecord.from_json(doc, ckpt.url(rel), record.step)
    # atomic: a writer killed midway never leaves a torn record that loses the step its metrics
    ckpt.write(rel, json.dumps(doc, indent=1).encode(), atomic=True, exclusive=exclusive)


# -- evaluator claims ----------------------------------------------------------------------------
def claim_time(ckpt: Storage, rel: str) -> float | None:
    """When the evaluator claim `rel` was made (its "at", epoch seconds); None when the file
    is absent or damaged (not JSON, not an object, "at" not a finite number)."""
    try:
        doc = _read_json(ckpt, rel, "delete it to have the step evaluated")
    except RecordError:
        return None
    at = doc.get("at") if isinstance(doc, dict) else None
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
        return None
    return float(at)


# -- pins ----------------------------------------------------------------------------------------
def pinned(ckpt: Storage, step: int) -> bool:
    """True when `step` is pinned (whatever the PIN file holds)."""
    return ckpt.exists(pin_path(step))


def pin_reason(ckpt: Storage, step: int) -> str | None:
    """Why `step` was pinned; None when it is not pinned, or the PIN file gives no readable
    reason (the step is pinned all the same: a PIN is decided by its existence)."""
    with contextlib.suppress(RecordError):
        doc = _read_json(ckpt, pin_path(step), "write it again with `ckptflow ckpt pin`")
        reason = doc.get("reason") if isinstance(doc, dict) else None
        return reason if isinstance(reason, str) and len(reason) <= MAX_TEXT else None
    return None


def pin(ckpt: Storage, step: int, reason: str, *, exclusive: bool = False) -> bool:
    """Pin `step`; with `exclusive`, only when no PIN exists yet. True when this call wrote it."""
    from ckptflow.core.storage import AlreadyExists

    doc = {"reason": reason, "pinned_at": time.time()}
    with contextlib.suppress(AlreadyExists):
        # atomic either way: a torn PIN would lose the reason (or read as damage)
        ckpt.write(pin_path(step), json.dumps(doc).encode(), exclusive=exclusive, atomic=True)
        return True
    return False


def unpin(ckpt: Storage, step: int) -> bool:
    """Remove the pin of `step`; False when it was not pinned."""
    if not pinned(ckpt, step):
        return False
    ckpt.delete([pin_path(step)])
    return True

"""Step plumbing: a step's lifecycle (`step_run`), and what it reports besides MLflow (Argo
output files, log lines, progress).

Every step's `main` runs its work inside `step_run`, which owns what each step used to repeat:
logging, the step's MLflow run (started from its config, ended FINISHED or FAILED), its Argo
outputs, and the exit code; a user error becomes one log line and exit code 2, no traceback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

from ckptflow.steps.lib.lineage import EXPERIMENT, Lineage

from ckptflow.core.errors import CheckpointError

log = logging.getLogger("ckptflow.progress")
USER_ERROR_EXIT = 2  # exit code of a failure the user can fix (a bad argument, base, step)


class StepError(Exception):
    """A failure the user can fix: logged as its message alone (no traceback), exit code."""

    def __init__(self, message: str, exit_code: int = USER_ERROR_EXIT):
        super().__init__(message)
        self.exit_code = exit_code


class Abandon(Exception):
    """Leave at once, as a kill would: no outputs written; the MLflow run is left as it is,
    or ended with `end_status` when set (a preemption leaves in order)."""

    exit_code = 1
    end_status: str | None = None


# What a user can cause: our own StepError, a checkpoint that is missing or damaged, and a bad
# value (the libraries raise ValueError for arguments they cannot use).
USER_ERRORS = (StepError, CheckpointError, ValueError)


@dataclass
class StepRun:
    """What a step's body reports through `step_run`."""

    lineage: Lineage | None  # the step's MLflow run; None where this process does not report
    outputs: dict = field(default_factory=dict)  # Argo output parameters, written at the end
    status: str = "FINISHED"  # the MLflow status the run ends with
    exit_code: int = 0  # what main() returns

    def fail(self, exit_code: int = 1) -> None:
        """End FAILED with `exit_code`, outputs still written (e.g. some evaluations failed)."""
        self.status, self.exit_code = "FAILED", exit_code


TRAINING = ("pretrain", "finetune")  # steps whose config's task and seed name their corpus


def _open_lineage(kind: str, cfg, *, run_root, run_name, params, tags, attach) -> Lineage | None:
    """The step's MLflow run: a new one (nested under the config's parent run when it names
    one), or the existing run `attach` names; None when `attach` is "" (no run to end)."""
    if attach == "":
        return None
    root = getattr(cfg, "run_root", "") if run_root is None else run_root
    lineage = Lineage.for_run_root(root or None)
    if attach is not None:
        lineage.attach(attach)
        return lineage
    lineage.start_run(
        run_name or kind,
        experiment=getattr(cfg, "experiment", EXPERIMENT),
        step_kind=kind,
        parent_run_id=getattr(cfg, "mlflow_parent_run_id", "") or None,
        tags=tags,
        params=asdict(cfg) if params is None else params,
    )
    if kind in TRAINING:  # the corpus it trains on, as MLflow's dataset input
        lineage.log_dataset(getattr(cfg, "task", ""), getattr(cfg, "seed", 0), "training")
    return lineage


def _end(run: StepRun, keep_open: bool) -> None:
    if run.lineage is None:
        return
    if keep_open and run.status == "FINISHED":
        run.lineage.flush()  # the pipeline's run stays open for the steps nested under it
    else:
        run.lineage.close(run.status)


@contextlib.contextmanager
def step_run(
    kind: str,
    cfg,
    step_log: logging.Logger,
    *,
    rank: int = 0,
    main: bool = True,
    run_root: str | None = None,
    run_name: str = "",
    params: dict | None = None,
    tags: dict | None = None,
    attach: str | None = None,
    keep_open: bool = False,
) -> Iterator[StepRun]:
    """A step's lifecycle around its body; read the exit code from the yielded StepRun after it.

    Sets up logging (prefixed with `rank`), starts the MLflow run `kind` from `cfg` (its
    run_root, experiment, mlflow_parent_run_id; params: the config, or `params`), and at the
    end writes `run.outputs` to cfg.output_dir and ends the run with `run.status`. Only where
    `main` (rank 0 of a job) is anything recorded or written. A user error (USER_ERRORS) is
    logged as one line on `step_log` and ends the run FAILED with exit code 2 (StepError: its
    own), outputs not written; any other exception ends it FAILED and propagates; `Abandon`
    leaves everything as it is (a preemption's ends the run with its `end_status`). `attach`
    ends an existing run instead of starting one; `keep_open` leaves a successful run open
    (the pipeline's parent run).
    """
    setup_logging(rank)
    lineage = None
    if main:
        lineage = _open_lineage(
            kind, cfg, run_root=run_root, run_name=run_name, params=params, tags=tags, attach=attach
        )
    run = StepRun(lineage)
    try:
        yield run
    except Abandon as exc:
        run.exit_code = exc.exit_code  # as a kill would: nothing written
        if exc.end_status:
            run.status = exc.end_status
            _end(run, keep_open)
        return
    except USER_ERRORS as exc:
        step_log.error("%s", exc)
        run.status = "FAILED"
        run.exit_code = exc.exit_code if isinstance(exc, StepError) else USER_ERROR_EXIT
        _end(run, keep_open)
        return
    except BaseException:
        run.status = "FAILED"
        _end(run, keep_open)
        raise
    if main and run.outputs:
        write_outputs(getattr(cfg, "output_dir", ""), run.outputs)
    _end(run, keep_open)


def write_outputs(output_dir: str | None, values: dict) -> None:
    """One small text file per value in --output-dir: Argo reads them as output parameters."""
    if not output_dir:
        return
    os.makedirs(output_dir, exist_ok=True)
    for name, value in values.items():
        text = value if isinstance(value, str) else json.dumps(value)
        with open(os.path.join(output_dir, name), "w") as f:
            f.write(text)


def setup_logging(rank: int = 0) -> None:
    """Plain timestamped lines on stderr, prefixed with the rank (logs, not terminals)."""
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s [rank{rank}] %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    # its SQLAlchemy store logs a full traceback per failed call; our own warning says enough
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


class Progress:
    """Training progress (`ckptflow.core.progress`): a tqdm bar with rate and ETA on a terminal,
    log lines above it; plain `step N/TOTAL ...` log lines every `every` steps otherwise."""

    KEYS = ("train_loss", "lr", "tokens_per_s")  # what the line shows of a step's metrics

    def __init__(
        self,
        total: int,
        *,
        enabled: bool = True,
        every: int | None = None,
        stream=None,
        initial: int = 0,
    ):
        from ckptflow.core.progress import Progress as Counter

        self.counter = Counter(
            total,
            initial=initial,
            enabled=enabled,
            stream=stream,
            every_n=every or max(10, total // 20),
            logger=log,
        )
        self.tty = self.counter.tty

    def update(self, step: int, metrics: dict) -> None:
        text = " ".join(f"{k} {metrics[k]:.4g}" for k in self.KEYS if k in metrics)
        self.counter.update_to(step, text)

    def close(self) -> None:
        self.counter.close()

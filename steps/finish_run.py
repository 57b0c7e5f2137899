"""`python -m ckptflow.steps.finish_run`: the exit handler, closing the parent MLflow run.

Argo's `{{workflow.status}}` (Succeeded, Failed, Error) becomes the run status (FINISHED,
FAILED). Never fails the workflow because of MLflow: a warning is all an outage costs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ckptflow.steps.lib import lineage as lin
from ckptflow.steps.lib import plumbing

log = logging.getLogger("ckptflow.finish_run")
STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "error": "FAILED", "killed": "KILLED"}


@dataclass(frozen=True)
class FinishRunConfig:
    """Which run to close and how the workflow ended."""

    run_id: str = ""  # the parent run (start_run's output); empty: nothing to do
    status: str = "Succeeded"  # Argo's workflow.status (Succeeded, Failed, Error)
    run_root: str = ""  # local run root: its mlflow.db is used when MLFLOW_TRACKING_URI is unset
    output_dir: str = ""  # unused (every step accepts it)


def parse_args(argv=None) -> FinishRunConfig:
    p = lin.arg_parser(
        FinishRunConfig, "python -m ckptflow.steps.finish_run", __doc__.split("\n")[0]
    )
    return FinishRunConfig(**vars(p.parse_args(argv)))


def main(argv=None) -> int:
    cfg = parse_args(argv)
    status = STATUS.get(cfg.status.strip().lower(), "FAILED")
    with plumbing.step_run("finish_run", cfg, log, attach=cfg.run_id) as run:
        if run.lineage is None:
            log.warning("no parent run id (MLflow was unavailable at start_run): nothing to close")
        else:
            run.lineage.set_tags({"ckptflow.workflow_status": cfg.status})
            run.status = status  # what step_run ends the run with
            log.info("closing run %s as %s (workflow %s)", cfg.run_id, status, cfg.status)
    return run.exit_code


if __name__ == "__main__":
    raise SystemExit(main())

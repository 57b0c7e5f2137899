"""`python -m ckptflow.steps.finish_run`: the exit handler, closing the parent MLflow run.

Argo's `{{workflow.status}}` (Succeeded, Failed, Error) becomes the run status (FINISHED,
FAILED). Never fails the workflow because of MLflow: a warning is all an outage costs.
"""

from __future__ import annotations

import logging

from ckptflow.steps.lib import lineage as lin

from ckptflow.contract import FinishRunArgs, parse

log = logging.getLogger("ckptflow.finish_run")
STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "error": "FAILED", "killed": "KILLED"}


def parse_args(argv=None) -> FinishRunArgs:
    return parse(FinishRunArgs, argv, description=__doc__.split("\n")[0])


def main(argv=None) -> int:
    cfg = parse_args(argv)
    lin.setup_logging()
    if not cfg.run_id:
        log.warning("no parent run id (MLflow was unavailable at start_run): nothing to close")
        return 0
    status = STATUS.get(cfg.status.strip().lower(), "FAILED")
    lineage = lin.Lineage.for_run_root(cfg.run_root or None)
    lineage.attach(cfg.run_id)
    lineage.set_tags({"ckptflow.workflow_status": cfg.status})
    lineage.close(status)
    log.info("closed run %s as %s (workflow %s)", cfg.run_id, status, cfg.status)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

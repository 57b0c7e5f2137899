"""`python -m ckptflow.steps.finish_run`: the exit handler, closing the parent MLflow run.

Argo's `{{workflow.status}}` (Succeeded, Failed, Error) becomes the run status (FINISHED,
FAILED). Never fails the workflow because of MLflow: a warning is all an outage costs.
"""

from __future__ import annotations

import logging

from ckptflow.steps.lib import plumbing

from ckptflow.contract import FinishRunArgs, parse

log = logging.getLogger("ckptflow.finish_run")
STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "error": "FAILED", "killed": "KILLED"}


def parse_args(argv=None) -> FinishRunArgs:
    return parse(FinishRunArgs, argv, description=__doc__.split("\n")[0])


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

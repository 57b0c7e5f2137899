"""`python -m ckptflow.steps.start_run`: open the pipeline's parent MLflow run and output its id.

Tags name the Argo workflow (name, uid, namespace), the image and the git commit; the whole
pipeline configuration becomes params. Every later step nests its own run under this one with
`--mlflow-parent-run-id`. With MLflow unreachable the step still succeeds and outputs an empty
run id (the later steps then log top-level runs): lineage must never stop a pipeline.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from ckptflow.steps.lib import env, plumbing
from ckptflow.steps.lib import lineage as lin

log = logging.getLogger("ckptflow.start_run")


@dataclass(frozen=True)
class StartRunConfig:
    """The parent run's identity and the pipeline configuration it records."""

    experiment: str = lin.EXPERIMENT  # MLflow experiment (created when missing)
    run_name: str = "pipeline"  # the parent run's name (the workflow name in Argo)
    workflow_name: str = ""  # Argo workflow name (default: ARGO_WORKFLOW_NAME)
    workflow_uid: str = ""  # Argo workflow uid (default: ARGO_WORKFLOW_UID)
    namespace: str = ""  # Kubernetes namespace (default: ARGO_NAMESPACE)
    config_json: str = "{}"  # the full pipeline configuration, logged as params
    run_root: str = ""  # local run root: its mlflow.db is used when MLFLOW_TRACKING_URI is unset
    output_dir: str = ""  # where Argo output parameters are written (run_id)


def parse_args(argv=None) -> StartRunConfig:
    p = lin.arg_parser(StartRunConfig, "python -m ckptflow.steps.start_run", __doc__.split("\n")[0])
    cfg = StartRunConfig(**vars(p.parse_args(argv)))
    try:
        if not isinstance(json.loads(cfg.config_json), dict):
            raise ValueError("not an object")
    except ValueError as exc:
        p.error(
            f"--config-json must be a JSON object ({exc}); e.g. --config-json '{{\"lr\": 0.001}}'"
        )
    return cfg


def main(argv=None) -> int:
    cfg = parse_args(argv)
    argo = env.argo_workflow_info()
    tags = {
        "ckptflow.workflow_name": cfg.workflow_name or argo.get("workflow_name", ""),
        "ckptflow.workflow_uid": cfg.workflow_uid or argo.get("workflow_uid", ""),
        "ckptflow.namespace": cfg.namespace or argo.get("namespace", ""),
    }
    with plumbing.step_run(
        "pipeline",
        cfg,
        log,
        run_name=cfg.run_name,
        params=json.loads(cfg.config_json),
        tags={k: v for k, v in tags.items() if v},
        keep_open=True,  # the later steps nest under it; finish_run closes it
    ) as run:
        run_id = run.lineage.run_id
        run.outputs["run_id"] = run_id or ""
        log.info(
            "parent run %s in experiment %r (%s)",
            run_id or "(none: MLflow unavailable)",
            cfg.experiment,
            run.lineage.tracking_uri,
        )
    return run.exit_code


if __name__ == "__main__":
    raise SystemExit(main())

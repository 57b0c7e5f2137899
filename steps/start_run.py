"""`python -m ckptflow.steps.start_run`: open the pipeline's parent MLflow run and output its id.

Tags name the Argo workflow (name, uid, namespace), the image and the git commit; the whole
pipeline configuration becomes params. Every later step nests its own run under this one with
`--mlflow-parent-run-id`. With MLflow unreachable the step still succeeds and outputs an empty
run id (the later steps then log top-level runs): lineage must never stop a pipeline.
"""

from __future__ import annotations

import logging

from ckptflow.steps.lib import plumbing

from ckptflow import env
from ckptflow.contract import StartRunArgs, parse
from ckptflow.core import jsonfile

log = logging.getLogger("ckptflow.start_run")


def config_params(text: str) -> dict:
    """The run's params from --config-json: a JSON object, or Argo's workflow parameter list
    (`{{workflow.parameters.json}}`: [{"name": ..., "value": ...}, ...]) as name -> value."""
    doc = jsonfile.loads(text, what="--config-json")
    if isinstance(doc, list) and all(isinstance(p, dict) and "name" in p for p in doc):
        return {str(p["name"]): p.get("value", "") for p in doc}
    if not isinstance(doc, dict):
        raise ValueError("not an object or an Argo parameter list")
    return doc


def _check(p, cfg: StartRunArgs) -> None:
    try:
        config_params(cfg.config_json)
    except (ValueError, jsonfile.BadJsonFile) as exc:
        p.error(
            f"--config-json must be a JSON object ({exc}); e.g. --config-json '{{\"lr\": 0.001}}'"
        )


def parse_args(argv=None) -> StartRunArgs:
    return parse(StartRunArgs, argv, description=__doc__.split("\n")[0], check=_check)


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
        params=config_params(cfg.config_json),
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

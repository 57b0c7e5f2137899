"""The whole pipeline as one workflow and one MLflow parent run.

    start-run -> pretrain (N ranks, rank 0 hosting the rendezvous; background evaluator)
              -> finetune (variant fan-out on fewer workers -> select: export + register)
    onExit: finish-run --status {{workflow.status}}

Layout under the run root `<storage_root>/<workflow name>` (or `pretrain.run_root`'s parent
when fixed): `pretrain/` (ckpt/, FINISHED), `finetune/<variant>/`, `export/`. Only these URIs
and the parent run id pass through Argo.

From Python, `build_pipeline(cfg)` returns a hera Workflow: `.to_yaml()` renders it and
`.create()` submits it through hera's WorkflowsService (configure hera *before* building:
the Workflow takes its service from `global_config` when it is constructed):

    from hera.shared import global_config
    from ckptflow.workflows.config import PipelineConfig, apply_overrides
    from ckptflow.workflows.pipeline import build_pipeline

    global_config.host = "http://localhost:2746"
    global_config.token = "..."          # or a callable returning one
    cfg = apply_overrides(PipelineConfig(), ["pretrain.ranks=4"])
    build_pipeline(cfg).create()
"""

from __future__ import annotations

from ckptflow.workflows import parameters
from ckptflow.workflows.config import PipelineConfig
from ckptflow.workflows.finetune_dag import add_finetune_dag
from ckptflow.workflows.pretrain_dag import add_pretrain_dag
from ckptflow.workflows.staged_workflow import Stage, staged_workflow
from ckptflow.workflows.templates import run_root
from hera.workflows import Workflow


def build_pipeline(cfg: PipelineConfig) -> Workflow:
    """start_run -> pretrain -> fine-tune fan-out -> select (export, register); finish_run."""
    pc, fc = cfg.pretrain, cfg.finetune
    root = run_root(cfg.platform, "")
    pretrain_root = pc.run_root.rstrip("/") or f"{root}/pretrain"
    stages = [
        Stage("pretrain", add_pretrain_dag, {"run_root": pretrain_root}),
        Stage(
            "finetune",
            add_finetune_dag,
            {
                "base_root": fc.base_root.rstrip("/") or pretrain_root,
                "run_root": fc.run_root.rstrip("/") or root,
            },
        ),
    ]
    return staged_workflow(
        cfg,
        stages,
        prefix=cfg.name,
        title="ckptflow pipeline: pretrain, fine-tune fan-out, select",
        description=(
            "pretrain on N ranks (each checkpoint evaluated in the background), fine-tune "
            f"each variant on {fc.workers} worker(s), select by the metric, register "
            f"{fc.select.model_name}; the knobs are the workflow parameters"
        ),
        arguments=parameters.arguments(cfg, parameters.PIPELINE),
    )

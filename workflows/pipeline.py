"""The whole pipeline as one workflow and one MLflow parent run.

    start-run -> pretrain (rdzv daemon, N ranks, background evaluator)
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

    global_config.host = "https://localhost:2746"
    global_config.token = "..."          # or a callable returning one
    cfg = apply_overrides(PipelineConfig(), ["pretrain.ranks=4"])
    build_pipeline(cfg).create()
"""

from __future__ import annotations

from ckptflow.workflows import lineage
from ckptflow.workflows.config import PipelineConfig
from ckptflow.workflows.finetune import add_finetune_dag, variants
from ckptflow.workflows.pretrain import add_pretrain_dag
from ckptflow.workflows.templates import run_root
from hera.workflows import DAG, Workflow


def build_pipeline(cfg: PipelineConfig) -> Workflow:
    """start_run -> pretrain -> fine-tune fan-out -> select (export, register); finish_run."""
    pc, fc = cfg.pretrain, cfg.finetune
    root = run_root(cfg.platform, "")
    pretrain_root = pc.run_root.rstrip("/") or f"{root}/pretrain"
    base_root = fc.base_root.rstrip("/") or pretrain_root
    w = lineage.lineage_workflow(
        cfg,
        prefix=cfg.name,
        title=(
            f"ckptflow pipeline: {pc.model} on {pc.ranks} ranks, "
            f"{len(variants(fc))} fine-tunes x {fc.workers} workers"
        ),
        description=(
            f"pretrain {pc.max_steps} steps (checkpoint every {pc.ckpt_every}, evaluated in "
            f"the background), fine-tune on {fc.task}, select by {fc.mode} {fc.metric}, "
            f"register {fc.model_name}"
        ),
    )
    with w:
        start = lineage.start_run_template(cfg, ("pretrain", "finetune"))
        lineage.finish_run_template(cfg)
        pretrain = add_pretrain_dag(cfg)
        finetune = add_finetune_dag(cfg)
        parent = lineage.PARENT_RUN_ID
        with DAG(name="main"):
            s = start(name=lineage.START_TASK)
            p = pretrain(
                name="pretrain",
                arguments={"run_root": pretrain_root, "parent_run_id": parent},
            )
            f = finetune(
                name="finetune",
                arguments={
                    "base_root": base_root,
                    "run_root": fc.run_root.rstrip("/") or root,
                    "parent_run_id": parent,
                },
            )
            s >> p >> f
    return w

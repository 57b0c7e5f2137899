"""Fine-tune fan-out over a grid of variants, then the `select` fan-in, as an Argo DAG.

Each variant is one pod running `torchrun --standalone --nproc-per-node=M` (M workers on one
node, fewer than the pretraining ranks: the fan-in of a many-rank checkpoint into a few
workers happens inside the step's load). Variants write under `<run_root>/finetune/<name>`,
names derived from the grid (`lr0.001-freeze1`), so `select` gets its candidates as URIs known
when the workflow is rendered and reads their evaluation results from storage: only
references pass through Argo. A failed variant does not stop the others (`continueOn`);
`select` reports and skips it, and fails only when all failed.
"""

from __future__ import annotations

import itertools

from ckptflow.workflows import lineage
from ckptflow.workflows.config import ConfigError, FinetuneConfig, PipelineConfig
from ckptflow.workflows.templates import param, run_root, step
from hera.workflows import DAG, Parameter, Workflow
from hera.workflows.models import ContinueOn

DAG_NAME = "finetune"


def variants(c: FinetuneConfig) -> list[dict[str, str]]:
    """The grid as withItems entries: name, lr, freeze (strings, as Argo passes them)."""
    grid = [
        {"name": f"lr{lr:g}-freeze{k}", "lr": f"{lr:g}", "freeze": str(k)}
        for lr, k in itertools.product(c.lrs, c.freeze_blocks)
    ]
    if not grid:
        raise ConfigError("finetune.lrs and finetune.freeze_blocks must each name a value")
    names = [v["name"] for v in grid]
    if len(set(names)) != len(names):
        raise ConfigError(f"finetune grid has duplicate variants {names}; remove repeats")
    return grid


def add_finetune_dag(cfg: PipelineConfig) -> DAG:
    """Add the variant and select templates and their DAG (inputs base_root, run_root,
    parent_run_id). Call inside a Workflow context."""
    p, c = cfg.platform, cfg.finetune
    if c.workers < 1:
        raise ConfigError("finetune.workers must be at least 1")
    parent = ["--mlflow-parent-run-id", param("parent_run_id")]
    variant = step(
        "finetune-variant",
        "finetune",
        [
            "--base-root", param("base_root"),
            "--base-step", c.base_step,
            "--run-root", param("variant_root"),
            "--task", c.task,
            "--lr", param("lr"),
            "--freeze-blocks", param("freeze"),
            "--max-steps", str(c.max_steps),
            "--ckpt-every", str(c.ckpt_every),
            "--seed", str(c.seed),
            *parent,
        ],
        platform=p,
        resources=c.resources,
        inputs=("base_root", "variant_root", "lr", "freeze", "parent_run_id"),
        output_names=("ckpt_root", "last_step"),
        launcher=["--standalone", "--nnodes=1", f"--nproc-per-node={c.workers}"],
        retries=c.retries,
        backoff_s=c.retry_backoff_s,
        deadline_s=c.deadline_s,
        shm_size=c.shm_size,
    )  # fmt: skip
    grid = variants(c)
    root = param("run_root")
    candidates = ",".join(f"{root}/finetune/{v['name']}" for v in grid)
    select = step(
        "select",
        "select",
        [
            "--candidates", candidates,
            "--metric", c.metric,
            "--mode", c.mode,
            "--export-uri", f"{root}/export",
            "--dtype", c.dtype,
            "--model-name", c.model_name,
            *(["--force"] if c.force else []),
            *parent,
        ],
        platform=p,
        inputs=("run_root", "parent_run_id"),
        output_names=("chosen", "model_version", "export_uri"),
        retries=1,
    )  # fmt: skip
    inputs = [Parameter(name=n) for n in ("base_root", "run_root", "parent_run_id")]
    with DAG(name=DAG_NAME, inputs=inputs) as dag:
        variant(
            name="variant",
            arguments={
                "base_root": param("base_root"),
                "variant_root": f"{root}/finetune/{{{{item.name}}}}",
                "lr": "{{item.lr}}",
                "freeze": "{{item.freeze}}",
                "parent_run_id": param("parent_run_id"),
            },
            with_items=grid,
            continue_on=ContinueOn(failed=True, error=True),
        )
        # select runs whatever became of each variant: it skips and reports failed ones.
        select(
            name="select",
            arguments={"run_root": root, "parent_run_id": param("parent_run_id")},
            depends="variant.Succeeded || variant.Failed || variant.Errored",
        )
    return dag


def build_finetune(cfg: PipelineConfig) -> Workflow:
    """Fine-tuning alone, from an existing pretraining run: fan-out, select, register.

    The base is `finetune.base_root`; left empty, it is the workflow argument `base_root`,
    which must then be given at submission (`--set finetune.base_root=URI`).
    """
    c = cfg.finetune
    w = lineage.lineage_workflow(
        cfg,
        prefix=f"{cfg.name}-finetune",
        title=f"ckptflow finetune: {len(variants(c))} variants x {c.workers} workers",
        description=f"task {c.task}, select by {c.mode} {c.metric}, register {c.model_name}",
    )
    w.arguments = [Parameter(name="base_root", value=c.base_root or None)]
    with w:
        start = lineage.start_run_template(cfg, ("finetune",))
        lineage.finish_run_template(cfg)
        finetune = add_finetune_dag(cfg)
        with DAG(name="main"):
            s = start(name=lineage.START_TASK)
            t = finetune(
                name="finetune",
                arguments={
                    "base_root": "{{workflow.parameters.base_root}}",
                    "run_root": run_root(cfg.platform, c.run_root),
                    "parent_run_id": lineage.PARENT_RUN_ID,
                },
            )
            s >> t
    return w

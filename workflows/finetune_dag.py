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

from dataclasses import replace

from ckptflow.workflows import parameters
from ckptflow.workflows.config import ConfigError, PipelineConfig
from ckptflow.workflows.metrics import save_metrics
from ckptflow.workflows.parameters import ref, variant_name, variants
from ckptflow.workflows.staged_workflow import Stage, staged_workflow
from ckptflow.workflows.templates import param, run_root, step
from hera.workflows import DAG, Container, Parameter, Workflow
from hera.workflows.models import ContinueOn

from ckptflow.contract import FinetuneArgs, SelectArgs, to_argv
from ckptflow.core import runroot

DAG_NAME = "finetune"
# Step arguments that are workflow parameters (ckptflow.workflows.parameters).
VARIANT_KNOBS = {
    "task": ref("finetune_task"),
    "max_steps": ref("finetune_steps"),
    "ckpt_every": ref("finetune_ckpt_every"),
    "base_step": ref("base_step"),
}
SELECT_KNOBS = {"metric": ref("metric"), "mode": ref("mode")}


def variant_root(root: str, name: str) -> str:
    """The run root of variant `name` below the pipeline's run root `root`."""
    return f"{root}/finetune/{name}"


def variant_template(cfg: PipelineConfig) -> Container:
    """One variant's pod: `ckptflow.steps.finetune` on M workers; its grid values are inputs."""
    c = cfg.finetune
    train = to_argv(
        c.train,
        base_root=param("base_root"),
        run_root=param("variant_root"),
        lr=param("lr"),
        freeze_blocks=param("freeze"),
        mlflow_parent_run_id=param("parent_run_id"),
        **VARIANT_KNOBS,
    )
    return step(
        "finetune-variant",
        "finetune",
        train,
        platform=cfg.platform,
        resources=c.resources,
        inputs=("base_root", "variant_root", "lr", "freeze", "parent_run_id"),
        output_names=FinetuneArgs.OUTPUTS,
        metrics=save_metrics("finetune-variant"),
        launcher=["--standalone", "--nnodes=1", f"--nproc-per-node={c.workers}"],
        retries=c.retries,
        backoff_s=c.retry_backoff_s,
        timeout=ref("finetune_timeout"),  # "" by default: no deadline
        retry_elsewhere=c.retry_elsewhere,
        shm_size=c.shm_size,
        grace_s=c.grace_s,
    )


def select_template(cfg: PipelineConfig) -> Container:
    """The fan-in: `ckptflow.steps.select` over every variant's run root (`finetune/*`: the
    variants are a workflow parameter, unknown when the manifest is rendered)."""
    c, root = cfg.finetune, param("run_root")
    choose = to_argv(
        replace(c.select, experiment=c.train.experiment),
        candidates=variant_root(root, "*"),
        export_uri=f"{root}/{runroot.EXPORT}",
        mlflow_parent_run_id=param("parent_run_id"),
        **SELECT_KNOBS,
    )
    return step(
        "select",
        "select",
        choose,
        platform=cfg.platform,
        inputs=("run_root", "parent_run_id"),
        output_names=SelectArgs.OUTPUTS,
        retries=1,
        transient_only=True,  # a failed selection fails again; a lost pod may not
    )


def add_finetune_dag(cfg: PipelineConfig) -> DAG:
    """Add the variant and select templates and their DAG (inputs base_root, run_root,
    parent_run_id). Call inside a Workflow context."""
    if cfg.finetune.workers < 1:
        raise ConfigError("finetune.workers must be at least 1")
    variants(cfg.finetune)  # a grid that names no variant, or one twice, is refused here
    variant, select = variant_template(cfg), select_template(cfg)
    root = param("run_root")
    inputs = [Parameter(name=n) for n in ("base_root", "run_root", "parent_run_id")]
    with DAG(name=DAG_NAME, inputs=inputs) as dag:
        variant(
            name="variant",
            arguments={
                "base_root": param("base_root"),
                "variant_root": variant_root(root, variant_name("{{item.lr}}", "{{item.freeze}}")),
                "lr": "{{item.lr}}",
                "freeze": "{{item.freeze}}",
                "parent_run_id": param("parent_run_id"),
            },
            with_param=ref("variants"),
            continue_on=ContinueOn(failed=True, error=True),
        )
        # select runs whatever became of each variant: it skips and reports failed ones.
        select(
            name="select",
            arguments={"run_root": root, "parent_run_id": param("parent_run_id")},
            depends="variant.Succeeded || variant.Failed || variant.Errored",
        )
    return dag


def ui_text(cfg: PipelineConfig) -> tuple[str, str]:
    """The Argo UI's title and description of the fine-tuning workflow."""
    c = cfg.finetune
    return (
        f"ckptflow finetune: variants x {c.workers} workers",
        f"fine-tune each variant, select the champion, register {c.select.model_name}",
    )


def build_finetune(cfg: PipelineConfig) -> Workflow:
    """Fine-tuning alone, from an existing pretraining run: fan-out, select, register.

    The base is `finetune.base_root`; left empty, it is the workflow argument `base_root`,
    which must then be given at submission (`--set finetune.base_root=URI`).
    """
    c = cfg.finetune
    refs = {"base_root": "{{workflow.parameters.base_root}}"}
    stage = Stage(
        "finetune", add_finetune_dag, {**refs, "run_root": run_root(cfg.platform, c.run_root)}
    )
    title, description = ui_text(cfg)
    return staged_workflow(
        cfg,
        [stage],
        prefix=f"{cfg.name}-finetune",
        title=title,
        description=description,
        arguments=[
            Parameter(
                name=parameters.BASE_ROOT,
                value=c.base_root or None,
                description="the pretraining run root to fine-tune from (its ckpt/ below)",
            ),
            *parameters.arguments(cfg, parameters.FINETUNE),
        ],
    )

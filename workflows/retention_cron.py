"""Retention as a CronWorkflow: a verification drill, then `ckptflow ckpt gc ROOT --policy SPEC
--yes`, on a schedule, per root.

The drill (`python -m ckptflow.steps.drill`) reads every byte of the newest
`retention.drill_newest` steps and test-loads the latest into its model; a step that fails is
marked CORRUPT for every reader and the drill fails, so the run fails (someone sees it) and
that root's gc does not run (the evidence stays; nothing older is collected on top of it).

Uses Argo v4's `spec.schedules` list (v4 removed the singular `schedule`); hera 7.1.0 maps
`CronWorkflow(schedules=[...])` to it natively. One gc pod per root (withItems); `gc` is
idempotent and resumable, so a retried or overlapping-then-forbidden run never loses a
checkpoint the policy keeps, and concurrencyPolicy Forbid keeps two runs off one root.
"""

from __future__ import annotations

from ckptflow.workflows import templates
from ckptflow.workflows.config import ConfigError, PipelineConfig
from ckptflow.workflows.metrics import drill_metrics
from ckptflow.workflows.templates import param, step
from hera.workflows import DAG, CronWorkflow, Parameter

from ckptflow.contract import DrillArgs, to_argv
from ckptflow.core import runroot


def retention_roots(cfg: PipelineConfig) -> list[str]:
    """The checkpoint roots to collect (the default: the fixed run `main`'s pretraining)."""
    roots = list(cfg.retention.roots) or [
        f"{cfg.platform.storage_root.rstrip('/')}/main/pretrain/{runroot.CKPT}"
    ]
    for root in roots:
        if "{{" in root:
            raise ConfigError(f"retention.roots: {root!r} must be a fixed URI, not a template")
    return roots


def build_retention(cfg: PipelineConfig) -> CronWorkflow:
    """A CronWorkflow running `ckptflow ckpt gc` with `retention.policy` on each root."""
    r, p = cfg.retention, cfg.platform
    if not r.schedules:
        raise ConfigError("retention.schedules is empty; set e.g. retention.schedules='17 * * * *'")
    roots = retention_roots(cfg)
    w = CronWorkflow(
        name=r.name,
        schedules=list(r.schedules),
        timezone=r.timezone,
        concurrency_policy=r.concurrency_policy,
        starting_deadline_seconds=r.starting_deadline_s,
        successful_jobs_history_limit=r.history_limit,
        failed_jobs_history_limit=r.history_limit,
        entrypoint="main",
        labels={"app.kubernetes.io/part-of": "ckptflow"},
        **templates.workflow_kwargs(
            p,
            title=f"ckptflow retention: {len(roots)} root(s)",
            description=f"ckptflow ckpt gc --policy {r.policy} on {', '.join(roots)}",
        ),
    )
    with w:
        gc = step(
            "gc",
            "ckptflow.cli",
            ["ckpt", "gc", param("root"), "--policy", r.policy, "--yes"],
            platform=p,
            inputs=("root",),
            retries=r.retries,
            deadline_s=r.deadline_s,
        )
        if r.drill_newest <= 0 and not r.drill_test_load:
            with DAG(name="main"):
                gc(name="gc", arguments={"root": "{{item}}"}, with_items=roots)
            return w
        drill = _drill_template(cfg)
        with DAG(name="one-root", inputs=[Parameter(name="root")]) as one_root:
            checked = drill(name="drill", arguments={"root": param("root")})
            checked >> gc(name="gc", arguments={"root": param("root")})
        with DAG(name="main"):
            one_root(name="root", arguments={"root": "{{item}}"}, with_items=roots)
    return w


def _drill_template(cfg: PipelineConfig):
    """The drill's container: verify the newest steps, test-load the latest (no retries: a
    failure is the finding, and the step is marked corrupt at once)."""
    r = cfg.retention
    args = DrillArgs(
        ckpt_root="", newest=r.drill_newest, test_load=r.drill_test_load, output_dir=""
    )
    return step(
        "drill",
        "drill",
        to_argv(args, ckpt_root=param("root")),
        platform=cfg.platform,
        inputs=("root",),
        output_names=DrillArgs.OUTPUTS,
        deadline_s=r.deadline_s,
        metrics=drill_metrics(),
    )

"""Retention as a CronWorkflow: `ckptflow ckpt gc ROOT --policy SPEC --yes` on a schedule.

Uses Argo v4's `spec.schedules` list (v4 removed the singular `schedule`); hera 7.1.0 maps
`CronWorkflow(schedules=[...])` to it natively. One gc pod per root (withItems); `gc` is
idempotent and resumable, so a retried or overlapping-then-forbidden run never loses a
checkpoint the policy keeps, and concurrencyPolicy Forbid keeps two runs off one root.
"""

from __future__ import annotations

from ckptflow.workflows import templates
from ckptflow.workflows.config import ConfigError, PipelineConfig
from ckptflow.workflows.templates import param, step
from hera.workflows import DAG, CronWorkflow

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
        with DAG(name="main"):
            gc(name="gc", arguments={"root": "{{item}}"}, with_items=roots)
    return w

"""Retention as a CronWorkflow: a verification drill, then `ckptflow ckpt gc ROOT --policy SPEC
--yes`, on a schedule, per root.

The drill (`python -m ckptflow.steps.drill`) reads every byte of the newest
`retention.drill_newest` steps and test-loads the latest into its model; a step that fails is
marked CORRUPT for every reader and the drill fails, so the run fails (someone sees it) and
that root's gc does not run (the evidence stays; nothing older is collected on top of it).

Uses Argo v4's `spec.schedules` list (v4 removed the singular `schedule`); hera 7.1.0 maps
`CronWorkflow(schedules=[...])` to it natively. The roots: `retention.roots`, or by default
every root the pipelines write under the storage root, found at each run by `ckptflow ckpt
roots` (none found fails the run: a wrong storage root is seen, never collected as nothing).
One gc pod per root (withItems, or withParam over the roots found); `gc` is
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

FIND = "find-roots"
FOUND = "{{tasks." + FIND + ".outputs.result}}"  # its stdout: a JSON list of roots


def retention_roots(cfg: PipelineConfig) -> list[str] | None:
    """The checkpoint roots named by `retention.roots`, or None: every root the pipelines write
    under the storage root (`NAME/pretrain/ckpt`, `NAME/finetune/VARIANT/ckpt`: a run's name is
    known only once it runs), found at each run by `ckptflow ckpt roots`."""
    roots = list(cfg.retention.roots)
    for root in roots:
        if "{{" in root:
            raise ConfigError(f"retention.roots: {root!r} must be a fixed URI, not a template")
    return roots or None


def _where(cfg: PipelineConfig, roots: list[str] | None) -> tuple[str, str]:
    """The UI's title and the roots' description."""
    if roots is None:
        under = cfg.platform.storage_root.rstrip("/")
        return "every checkpoint root", f"every checkpoint root under {under}"
    return f"{len(roots)} root(s)", ", ".join(roots)


def _find_template(cfg: PipelineConfig):
    """`ckptflow ckpt roots STORAGE_ROOT --json`: the roots with a committed step, printed as
    the JSON list the per-root tasks fan out over (withParam); none fails the run, so a wrong
    storage root is seen rather than collected as nothing."""
    r = cfg.retention
    return step(
        FIND,
        "ckptflow.cli",
        ["ckpt", "roots", cfg.platform.storage_root.rstrip("/"), "--json"],
        platform=cfg.platform,
        retries=r.retries,
        transient_only=True,  # none found is the finding: retried only when the pod errored
        deadline_s=r.deadline_s,
    )


def build_retention(cfg: PipelineConfig) -> CronWorkflow:
    """A CronWorkflow running `ckptflow ckpt gc` with `retention.policy` on each root."""
    r, p = cfg.retention, cfg.platform
    if not r.schedules:
        raise ConfigError("retention.schedules is empty; set e.g. retention.schedules='17 * * * *'")
    roots = retention_roots(cfg)
    title, where = _where(cfg, roots)
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
            title=f"ckptflow retention: {title}",
            description=f"ckptflow ckpt gc --policy {r.policy} on {where}",
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
        per_root = gc
        if r.drill_newest > 0 or r.drill_test_load:
            drill = _drill_template(cfg)
            with DAG(name="one-root", inputs=[Parameter(name="root")]) as per_root:
                checked = drill(name="drill", arguments={"root": param("root")})
                checked >> gc(name="gc", arguments={"root": param("root")})
        find = _find_template(cfg) if roots is None else None
        with DAG(name="main"):
            each = {"with_items": roots} if roots is not None else {"with_param": FOUND}
            task = per_root(name="root", arguments={"root": "{{item}}"}, **each)
            if find is not None:
                find(name=FIND) >> task
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

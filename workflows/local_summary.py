"""What `ckptflow run pipeline --local` prints at the end: what the run produced (checkpoints,
metrics, the champion, read back with the format core) and the commands to look at it, each
runnable from any directory."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from ckptflow.workflows.config import PipelineConfig

from ckptflow.core import runroot
from ckptflow.core.layout import step_dir

__all__ = ["champion_version", "mlflow_ui_command", "summary"]


def _outputs(result, display: str) -> list[dict[str, str]]:
    """Output parameters of every node shown as `display` (fanned-out tasks give several)."""
    out = []
    for node in result.nodes.values():
        if node.get("displayName", "").split("(")[0] == display and node.get("type") == "Pod":
            params = (node.get("outputs") or {}).get("parameters") or []
            if params:
                out.append({p["name"]: p.get("value", "") for p in params})
    return out


def _storage_options(cfg: PipelineConfig, env: dict[str, str]):
    """How the summary reaches the run's storage: the steps' S3 endpoint and keys (`env`)."""
    from ckptflow.core.storage import StorageOptions  # the format core: fsspec, no torch

    if not cfg.platform.s3_endpoint:
        return StorageOptions()
    keys = (env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY"))
    return StorageOptions(cfg.platform.s3_endpoint, credentials=keys if all(keys) else None)


def _checkpoints(root: str, options, problems: list[str]) -> list[tuple[int, dict]]:
    """(step, eval metrics) of each committed checkpoint under `<root>/ckpt`, read with the
    format core; unreadable eval records go to `problems`. A fine-tune's base, evaluated on
    the fine-tune's task, comes first as step "base"."""
    from ckptflow.core import rootreader
    from ckptflow.core.storage import Storage

    ckpt = runroot.ckpt_root(Storage(root, options=options))
    steps = rootreader.committed_steps(ckpt)
    evals = runroot.read_evals(ckpt, steps, problems)
    base = next((dict(r.base_metrics) for r in evals.values() if r.base_metrics), None)
    rows = [("base", base)] if base else []
    return rows + [(s, dict(evals[s].metrics) if s in evals else {}) for s in steps]


def _fmt(metrics: dict) -> str:
    return "  ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()
    )


def _variants(cfg: PipelineConfig, values: dict[str, str] | None) -> list[dict]:
    """The variants this run fanned out: `-p variants` when given, else the configuration's."""
    from ckptflow.workflows.parameters import variant_items

    if values and "variants" in values:
        return [{k: str(v) for k, v in item.items()} for item in json.loads(values["variants"])]
    return variant_items(cfg)


def _script(name: str) -> str:
    """How to run this environment's `name` command from any directory: its script beside the
    interpreter (absolute), else `python -m`."""
    exe = Path(sys.executable).parent / name
    module = "ckptflow.cli" if name == "ckptflow" else name
    return str(exe) if exe.exists() else f"{sys.executable} -m {module}"


def mlflow_experiment_url(db: Path, experiment: str) -> str | None:
    """The experiment's page in the UI that `mlflow ui` serves, in the model-training view:
    MLflow 3's UI opens in GenAI mode unless the URL asks otherwise (the experiment's kind
    tag does not switch it). None when the store or the experiment is not there."""
    import sqlite3

    if not db.is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
            row = con.execute(
                "select experiment_id from experiments where name = ?", (experiment,)
            ).fetchone()
    except sqlite3.Error:
        return None
    if row is None:
        return None
    return f"http://127.0.0.1:5000/#/experiments/{row[0]}?workflowType=machine_learning"


def champion_version(db: Path, model: str) -> str | None:
    """The version `model@champion` stands on in the registry at `db` (read-only), None when
    the store, the model or the alias is not there: select registers a version every run but
    moves the alias only on evidence, so the version it registered need not be the champion."""
    import sqlite3

    if not db.is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
            row = con.execute(
                "select version from registered_model_aliases where name = ? and alias = ?",
                (model, "champion"),
            ).fetchone()
    except sqlite3.Error:
        return None
    return None if row is None else str(row[0])


def _champion_line(chosen: dict[str, str], model: str, db: Path) -> str:
    """What select did with the chosen checkpoint: the version it registered and where the
    `champion` alias stands now (read back from the registry, not assumed)."""
    version = chosen.get("model_version") or ""
    head = f"  champion: {chosen.get('chosen', '?')} -> "
    if not version:
        return head + "not registered (MLflow not configured)"
    standing = champion_version(db, model)
    if standing is None:
        return head + f"registered as {model} version {version}"
    if standing == version:
        return head + f"registered as {model} version {version}, now {model}@champion"
    return (
        head + f"registered as {model} version {version}; {model}@champion is version "
        f"{standing} (left in place: the new one did not beat it; select's log says why)"
    )


def mlflow_ui_command(db: Path) -> str:
    """The command opening the MLflow UI on `db`, runnable from any directory (absolute)."""
    return f"{_script('mlflow')} ui --backend-store-uri sqlite:///{db.resolve()}"


def summary(
    cfg: PipelineConfig,
    name: str,
    result,
    runs_dir: Path,
    env: dict[str, str],
    mlflow_db: Path | None = None,
    values: dict[str, str] | None = None,
) -> str:
    """What the run produced, and how to look at it (`env`: the steps' S3 settings;
    `mlflow_db`: the tracking store, default `runs_dir/mlflow.db`)."""
    s3_endpoint = cfg.platform.s3_endpoint
    run_root = f"{cfg.platform.storage_root.rstrip('/')}/{name}"
    from ckptflow.workflows.finetune_dag import variant_name, variant_root

    roots = [("pretrain", f"{run_root}/pretrain")]
    if "finetune" in {n.get("displayName") for n in result.nodes.values()}:
        roots += [
            (f"finetune {n}", variant_root(run_root, n))
            for n in (variant_name(v["lr"], v["freeze"]) for v in _variants(cfg, values))
        ]
    lines = [f"\nproduced under {run_root}:"]
    for label, root in roots:
        problems: list[str] = []
        try:
            ckpts = _checkpoints(root, _storage_options(cfg, env), problems)
        except Exception as exc:  # a summary must not hide the run's own result
            lines.append(f"  {label}: cannot list checkpoints ({exc})")
            continue
        chosen = {o.get("chosen") for o in _outputs(result, "select")}
        n = sum(1 for step, _ in ckpts if step != "base")
        lines.append(f"  {label}: {n} committed checkpoints  ({root}/{runroot.CKPT})")
        for step, m in ckpts:
            here = f"{root}/{runroot.CKPT}/{step_dir(step)}" if step != "base" else ""
            mark = "  <- selected" if here in chosen else ""
            shown = "base (before)" if step == "base" else f"step {step:>6}"
            lines.append(f"    {shown}  {_fmt(m)}{mark}")
        lines += [f"    unreadable evaluation: {p}" for p in problems]
    db = mlflow_db or runs_dir / "mlflow.db"
    # a SQLite store keeps registered models' artifacts on this disk (--isolate's MLflow
    # server serves them, and ends with the command)
    local_store = cfg.platform.mlflow_tracking_uri.startswith("sqlite:")
    for chosen in _outputs(result, "select"):
        lines.append(_champion_line(chosen, cfg.finetune.select.model_name, db))
        lines.append(f"  exported: {chosen.get('export_uri', '?')}")
        lines.append(f"  run report: {run_root}/report.png")
        if chosen.get("model_version") and local_store:  # it loads with MLflow alone
            task = (values or {}).get("finetune_task") or cfg.finetune.train.task
            lines.append(
                f"  score it:   {_script('ckptflow')} evaluate "
                f"models:/{cfg.finetune.select.model_name}@champion "
                f"--tracking-uri sqlite:///{Path(db).resolve()} --task {task}"
            )
    lines.append(f"\nMLflow UI:  {mlflow_ui_command(db)}")
    if url := mlflow_experiment_url(db, cfg.platform.experiment):
        lines.append(f"  then open {url}")
    if s3_endpoint:
        kept = "; the registered model is a copy in MLflow's store and stays loadable"
        lines.append(
            "(the in-process S3 server, and the objects above, end with this command"
            f"{kept if local_store else ''})"
        )
    else:
        lines.append(
            f"checkpoints:  {_script('ckptflow')} ckpt ls {run_root}/pretrain/{runroot.CKPT}"
        )
    return "\n".join(lines)

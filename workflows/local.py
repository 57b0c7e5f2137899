"""`ckptflow run pipeline --local [--s3] [--set key=value ...]`: the real manifest, run here.

Renders `build_pipeline` (or `pretrain`, `finetune`) with a small configuration and runs the
rendered manifest through the local runner (`ckptflow.workflows.runner.run_workflow`), exactly the
YAML `ckptflow submit` would send. Embedded defaults, each overridable with `--set`:

- storage: `./runs/<workflow>/` (pretrain/, finetune/<variant>/, export/), or with `--s3` a
  bucket on an in-process S3 server (moto) that lives as long as the command;
- MLflow: the SQLite store `./runs/mlflow.db` (all local runs in one place, for one UI);
- no Kubernetes-only settings: no S3 Secret (keys, if any, come from this environment), no
  /dev/shm volume; one thread per process (OMP_NUM_THREADS=1) so ranks share few cores.

It ends with what was produced (checkpoints, metrics, the champion) and the command that
opens the MLflow UI on it.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import string
import sys
from pathlib import Path

from ckptflow.workflows.config import ConfigError, PipelineConfig, apply_overrides
from ckptflow.workflows.render import builder, manifests, to_yaml
from ckptflow.workflows.runner import REFUSED_EXIT, SpecError, run_workflow
from ckptflow.workflows.runner.artifact_repo import S3Repository

from ckptflow.core import runroot

LOCAL_TARGETS = ("pipeline", "pretrain", "finetune")
S3_BUCKET = "ckptflow-local"

# Small enough for a couple of minutes on 2 CPU cores, big enough to show every stage.
SMALL = (
    "platform.s3_secret=",
    "platform.s3_endpoint=",
    "platform.workflow_deadline_s=1800",
    "pretrain.shm_size=",
    "pretrain.ranks=2",
    "pretrain.max_steps=40",
    "pretrain.ckpt_every=10",
    "pretrain.full_every=2",
    "pretrain.warmup_steps=5",
    "pretrain.eval_poll_s=1",
    "pretrain.eval_timeout_s=900",
    "pretrain.rank_deadline_s=900",
    "pretrain.rdzv_join_timeout_s=300",
    "pretrain.retries=1",
    "pretrain.retry_backoff_s=1",
    "finetune.shm_size=",
    "finetune.lrs=1e-3,3e-4",
    "finetune.freeze_blocks=1",
    "finetune.workers=1",
    "finetune.max_steps=20",
    "finetune.ckpt_every=10",
    "finetune.retries=1",
    "finetune.retry_backoff_s=1",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_config(
    runs_dir: Path, *, s3_endpoint: str | None, overrides: list[str]
) -> PipelineConfig:
    """The small local configuration; `overrides` (the user's --set) come last and win."""
    storage = f"s3://{S3_BUCKET}/runs" if s3_endpoint else str(runs_dir)
    computed = [
        f"platform.storage_root={storage}",
        f"platform.mlflow_tracking_uri=sqlite:///{runs_dir / 'mlflow.db'}",
        f"pretrain.rdzv_port={_free_port()}",
    ]
    if s3_endpoint:
        computed.append(f"platform.s3_endpoint={s3_endpoint}")
    return apply_overrides(PipelineConfig(), [*SMALL, *computed, *overrides])


def _start_s3(env: dict[str, str]):
    """An in-process S3 server (moto) with the bucket; its env goes into `env`."""
    import logging

    from moto.server import ThreadedMotoServer

    # werkzeug logs every request at INFO: thousands of lines that bury the run's progress.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    # Fake keys for the fake server; a real deployment's come from the Secret.
    env.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="ckptflow-local",
        AWS_SECRET_ACCESS_KEY="ckptflow-local-secret",
        AWS_DEFAULT_REGION="us-east-1",
    )
    import boto3

    boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    ).create_bucket(Bucket=S3_BUCKET)
    return server, endpoint


def _artifact_repository(endpoint: str | None, env: dict[str, str]):
    """Artifacts on the in-process S3 server under `--s3` (bucket/artifacts/...), else the
    runner's default directory."""
    if endpoint is None:
        return None
    import boto3

    client = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1",
    )  # fmt: skip
    return S3Repository(client, S3_BUCKET, "artifacts")


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
    format core; unreadable eval records go to `problems`."""
    from ckptflow.core import rootreader
    from ckptflow.core.storage import Storage

    ckpt = runroot.ckpt_root(Storage(root, options=options))
    steps = rootreader.committed_steps(ckpt)
    evals = runroot.read_evals(ckpt, steps, problems)
    return [(s, dict(evals[s].metrics) if s in evals else {}) for s in steps]


def _fmt(metrics: dict) -> str:
    return "  ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()
    )


def summary(cfg: PipelineConfig, name: str, result, runs_dir: Path, env: dict[str, str]) -> str:
    """What the run produced, and how to look at it (`env`: the steps' S3 settings)."""
    s3_endpoint = cfg.platform.s3_endpoint
    run_root = f"{cfg.platform.storage_root.rstrip('/')}/{name}"
    from ckptflow.workflows.finetune import variants

    roots = [("pretrain", f"{run_root}/pretrain")]
    if "finetune" in {n.get("displayName") for n in result.nodes.values()}:
        roots += [
            (f"finetune {v['name']}", f"{run_root}/finetune/{v['name']}")
            for v in variants(cfg.finetune)
        ]
    lines = [f"\nproduced under {run_root}:"]
    for label, root in roots:
        problems: list[str] = []
        try:
            ckpts = _checkpoints(root, _storage_options(cfg, env), problems)
        except Exception as exc:  # a summary must not hide the run's own result
            lines.append(f"  {label}: cannot list checkpoints ({exc})")
            continue
        lines.append(f"  {label}: {len(ckpts)} committed checkpoints  ({root}/{runroot.CKPT})")
        lines += [f"    step {step:>6}  {_fmt(m)}" for step, m in ckpts]
        lines += [f"    unreadable evaluation: {p}" for p in problems]
    for chosen in _outputs(result, "select"):
        lines.append(
            f"  champion: {chosen.get('chosen', '?')} -> MLflow model "
            f"{cfg.finetune.model_name} version {chosen.get('model_version', '?')}"
        )
        lines.append(f"  exported: {chosen.get('export_uri', '?')}")
    db = runs_dir / "mlflow.db"
    if db.is_relative_to(Path.cwd()):
        db = db.relative_to(Path.cwd())
    lines.append(f"\nMLflow UI:  .venv/bin/mlflow ui --backend-store-uri sqlite:///{db}")
    if s3_endpoint:
        lines.append("(the in-process S3 server, and the objects above, end with this command)")
    else:
        lines.append(f"checkpoints:  ckptflow ckpt ls {run_root}/pretrain/{runroot.CKPT}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Render TARGET with the local configuration and run it through the local runner."""
    ap = argparse.ArgumentParser(prog="ckptflow run", description=__doc__.split("\n")[0])
    ap.add_argument("target", choices=LOCAL_TARGETS, help="the workflow to render and run")
    ap.add_argument("--local", action="store_true", help="run here (required; cf. submit)")
    ap.add_argument("--s3", action="store_true", help="store checkpoints on an in-process S3")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--runs-dir", default="runs", help="where runs and mlflow.db go")
    ap.add_argument("--name", help="workflow name (default: <name>-<random>)")
    args = ap.parse_args(argv)
    if not args.local:
        print(
            f"ckptflow run {args.target}: add --local to run it on this machine; "
            f"`ckptflow submit {args.target}` sends it to a cluster",
            file=sys.stderr,
        )
        return 2
    runs_dir = Path(args.runs_dir).resolve()
    runs_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # ranks, evaluator and agents share the cores
    server = endpoint = None
    try:
        if args.s3:
            server, endpoint = _start_s3(env)
        try:
            cfg = local_config(runs_dir, s3_endpoint=endpoint, overrides=args.overrides)
            builder(args.target)
            manifest = manifests(args.target, cfg)[0]
        except ConfigError as exc:
            print(f"ckptflow run: {exc}", file=sys.stderr)
            return 2
        suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        name = args.name or f"{manifest['metadata']['generateName']}{suffix}"
        workdir = runs_dir / name / "argo"
        (runs_dir / name).mkdir(parents=True, exist_ok=True)
        (runs_dir / name / "workflow.yaml").write_text(to_yaml([manifest]))
        print(f"running {name} locally (manifest: {runs_dir / name / 'workflow.yaml'})", flush=True)
        try:
            result = run_workflow(
                manifest, workdir=str(workdir), name=name, env=env,
                artifact_repository=_artifact_repository(endpoint, env),
            )  # fmt: skip
        except SpecError as exc:
            print(f"ckptflow run: {exc}", file=sys.stderr)
            return REFUSED_EXIT
        print(result.table)
        print(
            f"\nworkflow {result.name}: {result.phase}"
            + (f" ({result.message})" if result.message else "")
        )
        print(f"logs: {workdir / 'logs'}")
        print(summary(cfg, name, result, runs_dir, env))
        return result.exit_code
    finally:
        if server is not None:
            server.stop()

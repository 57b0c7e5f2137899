"""`ckptflow run pipeline --local [--s3] [--isolate] [--set key=value ...]`: the real manifest,
run here.

Renders `build_pipeline` (or `pretrain`, `finetune`) with a small configuration and runs the
rendered manifest through the local runner (`ckptflow.workflows.runner.run_workflow`), exactly the
YAML `ckptflow submit` would send. Embedded defaults, each overridable with `--set`:

- storage: `./runs/<workflow>/` (pretrain/, finetune/<variant>/, export/), or with `--s3` a
  bucket on an in-process S3 server (moto) that lives as long as the command;
- MLflow: the SQLite store `./runs/mlflow.db` (all local runs in one place, for one UI);
- no Kubernetes-only settings: no S3 Secret (keys, if any, come from this environment), no
  /dev/shm volume; one thread per process (OMP_NUM_THREADS=1) so ranks share few cores.
- `--isolate`: every task is a pod (docs/pods.md) and, as on a cluster, reaches the shared
  services only over the pods' bridge and only through the manifest's env: the in-process S3
  (implied) and a real `mlflow server` (store: `./runs/<workflow>/mlflow/`) listen on the node
  address, and the S3 keys go by Secret reference to the steps that ask for them.

It ends with what was produced (checkpoints, metrics, the champion) and the command that
opens the MLflow UI on it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import string
import sys
from dataclasses import replace
from pathlib import Path

from ckptflow.workflows.config import ConfigError, PipelineConfig, apply_overrides, validate
from ckptflow.workflows.local_services import S3_BUCKET, S3_KEYS, MlflowServer, free_port, start_s3
from ckptflow.workflows.render import builder, manifests, to_yaml
from ckptflow.workflows.runner import REFUSED_EXIT, IsolationError, SpecError, run_workflow
from ckptflow.workflows.runner.artifact_repo import S3Repository
from ckptflow.workflows.runner.isolation import new_node

from ckptflow.core import runroot

LOCAL_TARGETS = ("pipeline", "pretrain", "finetune")

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
    "pretrain.evaluator.poll_seconds=1",
    "pretrain.evaluator.timeout_seconds=900",
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


def local_config(
    runs_dir: Path,
    *,
    s3_endpoint: str | None,
    overrides: list[str],
    mlflow_uri: str | None = None,
) -> PipelineConfig:
    """The small local configuration; `overrides` (the user's --set) come last and win.
    `mlflow_uri`: a tracking server (under --isolate; the keys then go by Secret reference)."""
    storage = f"s3://{S3_BUCKET}/runs" if s3_endpoint else str(runs_dir)
    tracking = mlflow_uri or f"sqlite:///{runs_dir / 'mlflow.db'}"
    computed = [
        f"platform.storage_root={storage}",
        f"platform.mlflow_tracking_uri={tracking}",
        f"pretrain.rdzv_port={free_port()}",
    ]
    if s3_endpoint:
        computed.append(f"platform.s3_endpoint={s3_endpoint}")
    if mlflow_uri:
        computed.append(f"platform.s3_secret={PipelineConfig().platform.s3_secret}")
    cfg = apply_overrides(PipelineConfig(), [*SMALL, *computed, *overrides])
    validate(cfg)
    return cfg


def check_base(target: str, cfg: PipelineConfig) -> PipelineConfig:
    """`run finetune` needs a pretraining run to start from: refuse at once without one (rather
    than render base_root 'null' and fail after minutes of retries). A local base is made
    absolute: the steps do not run in this directory."""
    if target != "finetune":
        return cfg
    base = cfg.finetune.base_root
    hint = "e.g. --set finetune.base_root=runs/ckptflow-xxxxx/pretrain (a pipeline's pretrain)"
    if not base:
        raise ConfigError(f"finetune needs a base to start from: {hint}")
    if "://" not in base and not Path(base).exists():
        raise ConfigError(f"finetune.base_root={base}: no such folder; {hint}")
    if "://" not in base:
        cfg = replace(cfg, finetune=replace(cfg.finetune, base_root=str(Path(base).resolve())))
    return cfg


def _artifact_repository(endpoint: str | None):
    """Artifacts on the in-process S3 server (bucket/artifacts/...) when there is one, else the
    runner's default directory."""
    if endpoint is None:
        return None
    import boto3

    client = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=S3_KEYS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=S3_KEYS["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1",
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


def summary(
    cfg: PipelineConfig,
    name: str,
    result,
    runs_dir: Path,
    env: dict[str, str],
    mlflow_db: Path | None = None,
) -> str:
    """What the run produced, and how to look at it (`env`: the steps' S3 settings;
    `mlflow_db`: the tracking store, default `runs_dir/mlflow.db`)."""
    s3_endpoint = cfg.platform.s3_endpoint
    run_root = f"{cfg.platform.storage_root.rstrip('/')}/{name}"
    from ckptflow.workflows.finetune_dag import variant_root, variants

    roots = [("pretrain", f"{run_root}/pretrain")]
    if "finetune" in {n.get("displayName") for n in result.nodes.values()}:
        roots += [
            (f"finetune {v['name']}", variant_root(run_root, v["name"]))
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
            f"{cfg.finetune.select.model_name} version {chosen.get('model_version', '?')}"
        )
        lines.append(f"  exported: {chosen.get('export_uri', '?')}")
    db = mlflow_db or runs_dir / "mlflow.db"
    if db.is_relative_to(Path.cwd()):
        db = db.relative_to(Path.cwd())
    lines.append(f"\nMLflow UI:  .venv/bin/mlflow ui --backend-store-uri sqlite:///{db}")
    if s3_endpoint:
        lines.append("(the in-process S3 server, and the objects above, end with this command)")
    else:
        lines.append(f"checkpoints:  ckptflow ckpt ls {run_root}/pretrain/{runroot.CKPT}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ckptflow run", description=__doc__.split("\n")[0])
    ap.add_argument("target", choices=LOCAL_TARGETS, help="the workflow to render and run")
    ap.add_argument("--local", action="store_true", help="run here (required; cf. submit)")
    ap.add_argument("--s3", action="store_true", help="store checkpoints on an in-process S3")
    ap.add_argument(
        "--isolate", action="store_true",
        help="every task a pod; S3 (implied) and an MLflow server on the pods' bridge",
    )  # fmt: skip
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--runs-dir", default="runs", help="where runs and mlflow.db go")
    ap.add_argument("--name", help="workflow name (default: <name>-<random>)")
    return ap


def _services(stack: contextlib.ExitStack, args, env: dict[str, str]):
    """The pod node (--isolate) and the S3 server (--s3, --isolate), closed by `stack`;
    (node, S3 endpoint, MLflow server URI) with None for what is not there."""
    node = endpoint = mlflow_uri = None
    if args.isolate:
        node = new_node()
        stack.callback(node.close)
    host = node.address if node is not None else "127.0.0.1"
    if args.s3 or args.isolate:
        server, endpoint = start_s3(host)
        stack.callback(server.stop)
        env.update(S3_KEYS)  # under --isolate only the steps whose env asks get them
        if not args.isolate:  # process mode: the steps inherit this environment
            env.update(AWS_ENDPOINT_URL=endpoint, AWS_DEFAULT_REGION="us-east-1")
    if args.isolate:
        mlflow_uri = f"http://{host}:{free_port(host)}"
    return node, endpoint, mlflow_uri


def main(argv: list[str] | None = None) -> int:
    """Render TARGET with the local configuration and run it through the local runner."""
    args = _parser().parse_args(argv)
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
    with contextlib.ExitStack() as stack:
        try:
            node, endpoint, mlflow_uri = _services(stack, args, env)
            cfg = local_config(
                runs_dir, s3_endpoint=endpoint, overrides=args.overrides, mlflow_uri=mlflow_uri
            )
            builder(args.target)
            cfg = check_base(args.target, cfg)
            manifest = manifests(args.target, cfg)[0]
        except (ConfigError, IsolationError) as exc:
            print(f"ckptflow run: {exc}", file=sys.stderr)
            return 2
        suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        name = args.name or f"{manifest['metadata']['generateName']}{suffix}"
        workdir = runs_dir / name / "argo"
        (runs_dir / name).mkdir(parents=True, exist_ok=True)
        (runs_dir / name / "workflow.yaml").write_text(to_yaml([manifest]))
        mlflow_db = None
        if mlflow_uri:
            port = int(mlflow_uri.rsplit(":", 1)[1])
            tracking = stack.enter_context(
                MlflowServer(node.address, runs_dir / name / "mlflow", port)
            )
            mlflow_db = tracking.dir / "mlflow.db"
        print(f"running {name} locally (manifest: {runs_dir / name / 'workflow.yaml'})", flush=True)
        try:
            result = run_workflow(
                manifest, workdir=str(workdir), name=name, env=env, pod_node=node,
                artifact_repository=_artifact_repository(endpoint),
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
        print(summary(cfg, name, result, runs_dir, env, mlflow_db))
        return result.exit_code

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
- `--isolate --cluster PROFILE.yaml [--fail-node NODE@SECONDS ...]`: the pods are scheduled on
  the profile's nodes, and a node may fail silently, as with `ckptflow run FILE` (docs/local-runner.md).

It ends with what was produced (checkpoints, metrics, the champion) and the command that
opens the MLflow UI on it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import string
import sys
from dataclasses import replace
from pathlib import Path

from ckptflow.workflows.config import ConfigError, PipelineConfig, apply_overrides, validate
from ckptflow.workflows.local_services import S3_BUCKET, S3_KEYS, MlflowServer, free_port, start_s3
from ckptflow.workflows.local_summary import summary
from ckptflow.workflows.parameters import parse_pairs
from ckptflow.workflows.render import builder, manifests, to_yaml
from ckptflow.workflows.runner import (
    REFUSED_EXIT,
    IsolationError,
    SpecError,
    cluster_options,
    resolve_template_ref,
    run_workflow,
)
from ckptflow.workflows.runner.artifact_repo import S3Repository
from ckptflow.workflows.runner.cluster import ClusterError
from ckptflow.workflows.runner.isolation import new_node

from ckptflow.contract import cli_args

LOCAL_TARGETS = ("pipeline", "pretrain", "finetune")
NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

# What only a run on this machine needs: no S3 Secret or /dev/shm volume, short deadlines and
# retries, a fast-polling evaluator. The training recipe is not here: it is PipelineConfig's
# own defaults, the one that `ckptflow submit pipeline` sends to a cluster (issue 38), and
# it learns in a few minutes on 2 CPU cores (README, "What the main job shows").
SMALL = (
    "platform.s3_secret=",
    "platform.s3_endpoint=",
    "platform.workflow_deadline_s=1800",
    "pretrain.shm_size=",
    "pretrain.evaluator.poll_seconds=1",
    "pretrain.evaluator.timeout_seconds=900",
    "pretrain.timeout=900",
    "pretrain.rdzv_join_timeout_s=300",
    "pretrain.retries=1",
    "pretrain.retry_backoff_s=1",
    "finetune.shm_size=",
    "finetune.workers=1",
    "finetune.retries=1",
    "finetune.retry_backoff_s=1",
    # requests this machine's one node can schedule with every pod of a run at once (the
    # cluster model binds by request: runner/scheduler.py; a pod's use is bounded by its limits)
    "platform.step_resources.cpu=100m",
    "pretrain.rank_resources.cpu=100m",
    "pretrain.evaluator_resources.cpu=100m",
    "finetune.resources.cpu=100m",
    "evaluate.resources.cpu=100m",
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
        "platform.argo_ui=",  # no Argo Server runs here: no MLflow run links to its UI
    ]
    if s3_endpoint:
        computed.append(f"platform.s3_endpoint={s3_endpoint}")
    if mlflow_uri:
        computed.append(f"platform.s3_secret={PipelineConfig().platform.s3_secret}")
    cfg = apply_overrides(PipelineConfig(), [*SMALL, *computed, *overrides])
    validate(cfg)
    return cfg


def check_base(
    target: str, cfg: PipelineConfig, values: dict[str, str]
) -> tuple[PipelineConfig, dict[str, str]]:
    """`run finetune` needs a pretraining run to start from (`-p base_root` or
    `--set finetune.base_root`): refuse at once without one, rather than render base_root
    'null' and fail after minutes of retries. A local base is made absolute: the steps do not
    run in this directory."""
    if target != "finetune":
        return cfg, values
    base = values.get("base_root") or cfg.finetune.base_root
    hint = "e.g. -p base_root=runs/ckptflow-xxxxx/pretrain (a pipeline's pretraining run)"
    if not base:
        raise ConfigError(f"finetune needs a base to start from: {hint}")
    if "://" not in base and not Path(base).exists():
        raise ConfigError(f"base_root={base}: no such folder; {hint}")
    if "://" not in base:
        base = str(Path(base).resolve())
        cfg = replace(cfg, finetune=replace(cfg.finetune, base_root=base))
        values = {**values, "base_root": base} if "base_root" in values else values
    return cfg, values


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


EXAMPLES = """examples:
  ckptflow run pipeline --local
  ckptflow run pipeline --local -p ranks=3 -p pretrain_steps=80 -p metric=exact_match -p mode=max
  ckptflow run pipeline --local --from-template          (the WorkflowTemplate + a Workflow using it)
  ckptflow run finetune --local -p base_root=runs/ckptflow-xxxxx/pretrain
  ckptflow render --keys                                  (every --set setting)"""


def _parser() -> argparse.ArgumentParser:
    ap = cli_args.Parser(
        prog="ckptflow run",
        description=__doc__.split("\n")[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("target", choices=LOCAL_TARGETS, help="the workflow to render and run")
    ap.add_argument("--local", action="store_true", help="run here (required; cf. submit)")
    ap.add_argument("--s3", action="store_true", help="store checkpoints on an in-process S3")
    ap.add_argument(
        "--isolate", action="store_true",
        help="every task a pod; S3 (implied) and an MLflow server on the pods' bridge",
    )  # fmt: skip
    ap.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="a setting rendered into the manifest (see `ckptflow render --keys`)",
    )  # fmt: skip
    ap.add_argument(
        "-p", "--parameter", dest="parameters", action="append", default=[],
        metavar="NAME=VALUE", help="a workflow parameter (like `argo submit -p`), e.g. -p ranks=3",
    )  # fmt: skip
    ap.add_argument(
        "--from-template", action="store_true",
        help="render the WorkflowTemplate and run a Workflow that references it",
    )  # fmt: skip
    cluster_options.add_options(ap)  # as `ckptflow run FILE` takes them
    ap.add_argument("--runs-dir", default="runs", help="where runs and mlflow.db go")
    ap.add_argument("--name", help="workflow name (default: <name>-<random>)")
    return ap


def _documents(args, cfg: PipelineConfig, values: dict[str, str]) -> list[dict]:
    """What `ckptflow run` renders: the Workflow (its parameters' values from `-p`), or with
    --from-template the WorkflowTemplate and a Workflow referencing it (the Workflow last)."""
    builder(args.target)
    if not args.from_template:
        return [manifests(args.target, cfg, "workflow", values)[0]]
    template = manifests(args.target, cfg, "template")[0]
    return [template, manifests(args.target, cfg, "from-template", values)[0]]


def _name(args, workflow: dict) -> str:
    """The workflow's name: --name (checked: it names folders and MLflow runs), or
    generateName and a random suffix."""
    if args.name:
        if not NAME.fullmatch(args.name):
            raise ConfigError(
                f"--name {args.name!r}: use lower-case letters, digits and '-' (a Kubernetes name)"
            )
        return args.name
    suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
    return f"{workflow['metadata']['generateName']}{suffix}"


def _write(run_dir: Path, docs: list[dict]) -> dict:
    """workflow.yaml (and the template.yaml it references) into the run's folder; the manifest
    to run (a workflowTemplateRef resolved against the template, as the controller does)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for doc in docs:
        kind = "template" if doc["kind"] == "WorkflowTemplate" else "workflow"
        (run_dir / f"{kind}.yaml").write_text(to_yaml([doc]))
    return resolve_template_ref(docs[-1], docs[:-1])


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
    args = cli_args.parse(_parser(), argv, {"--set", "-p", "--parameter", "--name"})
    if isinstance(args, int):
        return args
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
            cluster = cluster_options.profile(args)  # ClusterError: one line
            failures = cluster_options.failures(args, cluster)
            node, endpoint, mlflow_uri = _services(stack, args, env)
            cfg = local_config(
                runs_dir, s3_endpoint=endpoint, overrides=args.overrides, mlflow_uri=mlflow_uri
            )
            values = parse_pairs(args.parameters)
            cfg, values = check_base(args.target, cfg, values)
            docs = _documents(args, cfg, values)
            name = _name(args, docs[-1])
        except (ConfigError, IsolationError, ClusterError) as exc:
            print(f"ckptflow run: {exc}", file=sys.stderr)
            return 2
        workdir = runs_dir / name / "argo"
        manifest = _write(runs_dir / name, docs)
        mlflow_db = None
        if mlflow_uri:
            port = int(mlflow_uri.rsplit(":", 1)[1])
            tracking = stack.enter_context(
                MlflowServer(node.address, runs_dir / name / "mlflow", port)
            )
            mlflow_db = tracking.dir / "mlflow.db"
        print(f"running {name} locally (manifest: {runs_dir / name / 'workflow.yaml'})", flush=True)
        try:
            # cwd: what the steps write relative to it (MLflow's ./mlruns artifacts) stays
            # under the runs directory.
            result = run_workflow(
                manifest, workdir=str(workdir), name=name, env=env, pod_node=node,
                artifact_repository=_artifact_repository(endpoint), cwd=str(runs_dir),
                cluster=cluster, fail_nodes=failures,
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
        print(summary(cfg, name, result, runs_dir, env, mlflow_db, values))
        return result.exit_code

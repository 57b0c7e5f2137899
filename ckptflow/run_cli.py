"""`ckptflow run`: run a workflow on this machine, from one of two kinds of target.

- `ckptflow run FILE.yaml [-p NAME=VALUE ...] [--workdir DIR] [--status-file FILE] [--name NAME]
  [--shared-tmp] [--isolate] [--artifact-repo DIR|s3://BUCKET/PREFIX]
  [--semaphore NAME=N] [--semaphore-config CONFIGMAP.yaml] [--cluster PROFILE.yaml]
  [--memo-cache DIR] [--objects FILE ...]`: a rendered manifest, handed to the local runner's API
  (`ckptflow.workflows.runner`: `load_manifest`, `run_workflow`), which knows nothing of builders;
- `ckptflow run pipeline --local [--s3] [--isolate] [--set KEY=VALUE ...]` (or `pretrain`, `finetune`): a
  builder name, rendered with a small local configuration and run by `ckptflow.workflows.local`.

A file of that name wins over the builder name. Only the second kind imports hera.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from pathlib import Path

from ckptflow.contract import cli_args
from ckptflow.workflows.runner import (
    REFUSED_EXIT,
    IsolationError,
    SpecError,
    cluster_options,
    load_documents,
    load_manifest,
    resolve_template_ref,
    run_workflow,
    workflow_name,
)
from ckptflow.workflows.runner.artifact_repo import DirRepository, S3Repository
from ckptflow.workflows.runner.cluster import ClusterError
from ckptflow.workflows.runner.document import workflow_name_problem
from ckptflow.workflows.runner.objects import ObjectError, load_objects
from ckptflow.workflows.runner.sync import limits_from_configmap, parse_limit

__all__ = ["BUILDER_TARGETS", "build_parser", "main", "resolve_manifest", "run_manifest"]

# The builder names `ckptflow run NAME --local` renders; ckptflow.workflows.local.LOCAL_TARGETS
# (written out here so that running a file never imports hera; a test keeps the two equal).
BUILDER_TARGETS = ("pipeline", "pretrain", "finetune")


def build_parser() -> argparse.ArgumentParser:
    p = cli_args.Parser(
        prog="ckptflow run",
        description="Run a rendered Argo Workflow (or WorkflowTemplate) manifest on this machine. "
        "Exit code: 0 Succeeded, 1 Failed, 2 Error, 3 refused manifest, 130 interrupted.",
        epilog=f"`ckptflow run {{{','.join(BUILDER_TARGETS)}}} --local` renders a workflow and "
        "runs it here (see `ckptflow run pipeline --help`). Examples:\n"
        "  ckptflow run pipeline --local -p ranks=3 -p pretrain_steps=80\n"
        "  ckptflow run runs/NAME/workflow.yaml -p ranks=3\n"
        "  ckptflow run wf.yaml --template-file template.yaml   (a workflowTemplateRef)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("target", help="a Workflow/WorkflowTemplate manifest (YAML or JSON)")
    p.add_argument(
        "-p", "--parameter", action="append", default=[], metavar="NAME=VALUE",
        help="a workflow parameter (repeatable), like `argo submit -p`",
    )  # fmt: skip
    p.add_argument(
        "--template-file", action="append", default=[], metavar="FILE",
        help="the WorkflowTemplate(s) a workflowTemplateRef names (repeatable)",
    )  # fmt: skip
    p.add_argument("--workdir", help="logs, pod directories, status (default runs/local/NAME)")
    p.add_argument(
        "--status-file", help="where to write the JSON status (default WORKDIR/status.json)"
    )
    p.add_argument(
        "--name", help="the workflow name (default: metadata.name or generateName+random)"
    )
    p.add_argument(
        "--shared-tmp", action="store_true",
        help="do not give each task a private /tmp (paths under /tmp are used as written)",
    )  # fmt: skip
    p.add_argument(
        "--isolate", action="store_true",
        help="run every task as a pod (own network namespace and IP, hostname, /tmp, volumes, "
        "memory limit; needs root, see docs/pods.md)",
    )  # fmt: skip
    cluster_options.add_options(p)
    p.add_argument(
        "--artifact-repo", metavar="DIR|s3://BUCKET[/PREFIX]",
        help="the artifact repository (default WORKDIR/artifacts); s3:// is reached with the "
        "endpoint and keys of this environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)",
    )  # fmt: skip
    p.add_argument(
        "--semaphore", action="append", default=[], metavar="NAME=N",
        help="the limit of a synchronization semaphore (repeatable); NAME is CONFIGMAP/KEY of "
        "its configMapKeyRef (or the key of a database semaphore)",
    )  # fmt: skip
    p.add_argument(
        "--memo-cache", metavar="DIR",
        help="where memoized templates keep their caches across runs (default: memo-cache "
        "beside the workdir)",
    )  # fmt: skip
    p.add_argument(
        "--semaphore-config", action="append", default=[], metavar="CONFIGMAP.yaml",
        help="semaphore limits from a ConfigMap manifest (each data KEY is NAME/KEY)",
    )  # fmt: skip
    p.add_argument(
        "--objects", action="append", default=[], metavar="FILE",
        help="Kubernetes objects (ConfigMaps, Secrets, WorkflowTemplates, any kind; YAML, many "
        "documents) put in the cluster model's object store before the run (repeatable): "
        "configMapKeyRef/secretKeyRef, secret/configMap volumes and resource templates read them",
    )  # fmt: skip
    return p


class UsageError(ValueError):
    """An option's value cannot be used (one line naming the fix; exit code 2)."""


def semaphore_limits(args: argparse.Namespace) -> dict[str, int]:
    """Semaphore limits from `--semaphore-config` files, then `--semaphore NAME=N` (winning)."""
    limits: dict[str, int] = {}
    try:
        for path in args.semaphore_config:
            limits.update(limits_from_configmap(path))
        limits.update(parse_limit(text) for text in args.semaphore)
    except ValueError as exc:
        raise SpecError(str(exc)) from exc
    return limits


def artifact_repository(target: str | None):
    """The runner's artifact repository for `--artifact-repo` (None: the runner's default)."""
    if not target:
        return None
    if not target.startswith("s3://"):
        return DirRepository(target)
    bucket, _, prefix = target[len("s3://") :].partition("/")
    if not bucket:
        raise SpecError(f"--artifact-repo {target!r}: expected s3://BUCKET[/PREFIX]")
    import boto3  # only when an S3 repository is asked for

    from ckptflow import env

    client = boto3.client("s3", endpoint_url=env.s3_endpoint_url(), region_name=env.s3_region())
    return S3Repository(client, bucket, prefix)


def parse_parameters(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SpecError(f"-p {pair!r}: expected NAME=VALUE")
        out[name] = value
    return out


def resolve_manifest(target: str, template_files: list[str] = ()) -> dict:
    """The manifest a file target names, its workflowTemplateRef (if any) resolved against the
    WorkflowTemplates of `template_files`."""
    if not Path(target).exists():
        raise SpecError(f"{target}: no such manifest file (give a rendered Workflow YAML)")
    manifest = load_manifest(target)
    templates = [d for f in template_files for d in load_documents(f)]
    return resolve_template_ref(manifest, templates)


def run_manifest(manifest: dict, args: argparse.Namespace) -> int:
    """Run a manifest dict with the parsed CLI options; print the table; return the exit code."""
    params = parse_parameters(args.parameter)
    name = args.name or workflow_name(manifest)
    problem = args.name and workflow_name_problem(args.name)
    if problem:
        raise UsageError(f"--name: {problem}")
    workdir = args.workdir or str(Path("runs") / "local" / name)
    cluster = cluster_options.profile(args)  # ClusterError: a usage error (exit 2)
    try:
        objects = load_objects(args.objects)  # a damaged file: one line naming it
    except ObjectError as exc:
        raise UsageError(f"--objects {exc}") from None
    result = run_workflow(
        manifest,
        arguments=params,
        workdir=workdir,
        status_file=args.status_file,
        name=name,
        private_tmp=not args.shared_tmp,
        isolate=args.isolate,
        artifact_repository=artifact_repository(args.artifact_repo),
        semaphores=semaphore_limits(args),
        cluster=cluster,
        fail_nodes=cluster_options.failures(args, cluster),
        memo_cache=args.memo_cache,
        objects=objects,
    )
    print(result.table)
    suffix = f" ({result.message})" if result.message else ""
    print(f"\nworkflow {result.name}: {result.phase}{suffix}")
    print(f"logs: {Path(result.workdir) / 'logs'}   status: {result.status_file}")
    return result.exit_code


def _sigterm(signum, frame):  # SIGTERM stops the run like Ctrl-C: processes are cleaned up
    raise KeyboardInterrupt


def run_file(argv: list[str]) -> int:
    """`ckptflow run FILE.yaml ...`: a refused manifest is one line on stderr and exit code 3."""
    args = cli_args.parse(build_parser(), argv, {"-p", "--parameter", "--semaphore"})
    if isinstance(args, int):
        return args
    if hasattr(signal, "SIGTERM"):
        # signal() refuses outside the main thread (e.g. main() called from a test thread)
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGTERM, _sigterm)
    try:
        manifest = resolve_manifest(args.target, args.template_file)
        return run_manifest(manifest, args)
    except SpecError as exc:
        print(f"ckptflow run: {exc}", file=sys.stderr)
        return REFUSED_EXIT
    except (IsolationError, ClusterError, UsageError) as exc:
        print(f"ckptflow run: {exc}", file=sys.stderr)
        return 2


def run_builder(argv: list[str]) -> int:
    """`ckptflow run pipeline --local ...`: parsed and run by the builders' local mode."""
    # Imported here, not at the top: it imports hera, which running a file never needs.
    from ckptflow.workflows.local import main as run_local

    return run_local(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in BUILDER_TARGETS and not Path(argv[0]).exists():
        return run_builder(argv)
    return run_file(argv)


if __name__ == "__main__":
    sys.exit(main())

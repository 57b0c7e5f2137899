"""`ckptflow run FILE.yaml [-p NAME=VALUE ...] [--workdir DIR] [--status-file FILE]`.

The file path is one kind of target; `resolve_manifest` is the place to add others (a pipeline
builder name rendered to a manifest), all ending in `run_manifest`, which takes a manifest dict.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from pathlib import Path

from ckptflow.workflows.runner.spec import SpecError, load_manifest
from ckptflow.workflows.runner.workflow import run_workflow

__all__ = ["build_parser", "main", "resolve_manifest", "run_manifest"]

REFUSED_EXIT = 3  # the manifest was refused before anything ran
BUILDER_TARGETS = ("pipeline", "pretrain", "finetune")  # see workflows/local.py


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ckptflow run",
        description="Run a rendered Argo Workflow (or WorkflowTemplate) manifest on this machine. "
        "Exit code: 0 Succeeded, 1 Failed, 2 Error, 3 refused manifest, 130 interrupted.",
    )
    p.add_argument("target", help="a Workflow/WorkflowTemplate manifest (YAML or JSON)")
    p.add_argument(
        "-p", "--parameter", action="append", default=[], metavar="NAME=VALUE",
        help="a workflow parameter (repeatable), like `argo submit -p`",
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
    return p


def parse_parameters(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SpecError(f"-p {pair!r}: expected NAME=VALUE")
        out[name] = value
    return out


def resolve_manifest(target: str) -> dict:
    """The manifest a target names; today a file path."""
    if not Path(target).exists():
        raise SpecError(f"{target}: no such manifest file (give a rendered Workflow YAML)")
    return load_manifest(target)


def run_manifest(manifest: dict, args: argparse.Namespace) -> int:
    """Run a manifest dict with the parsed CLI options; print the table; return the exit code."""
    params = parse_parameters(args.parameter)
    from ckptflow.workflows.runner.workflow import workflow_name

    name = args.name or workflow_name(manifest)
    workdir = args.workdir or str(Path("runs") / "local" / name)
    result = run_workflow(
        manifest,
        arguments=params,
        workdir=workdir,
        status_file=args.status_file,
        name=name,
        private_tmp=not args.shared_tmp,
    )
    print(result.table)
    suffix = f" ({result.message})" if result.message else ""
    print(f"\nworkflow {result.name}: {result.phase}{suffix}")
    print(f"logs: {Path(result.workdir) / 'logs'}   status: {result.status_file}")
    return result.exit_code


def _sigterm(signum, frame):  # SIGTERM stops the run like Ctrl-C: processes are cleaned up
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in BUILDER_TARGETS and not Path(argv[0]).exists():
        # `ckptflow run pipeline --local`: a builder name, rendered by hera then run here.
        from ckptflow.workflows.local import main as run_builder

        return run_builder(argv)
    args = build_parser().parse_args(argv)
    if hasattr(signal, "SIGTERM"):
        # signal() refuses outside the main thread (e.g. main() called from a test thread)
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGTERM, _sigterm)
    try:
        manifest = resolve_manifest(args.target)
        return run_manifest(manifest, args)
    except SpecError as exc:
        print(f"ckptflow run: {exc}", file=sys.stderr)
        return REFUSED_EXIT


if __name__ == "__main__":
    sys.exit(main())

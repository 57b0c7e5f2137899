"""The `ckptflow` command: a thin dispatcher.

Each subcommand lives in the package that owns it and is imported only when used, so
`ckptflow render`/`submit` need hera alone and never import torch, while `ckptflow ckpt`
needs only the format core's (fsspec, xxhash, zstandard, numpy), never torch.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> ("module", "function taking argv and returning an exit code", "help")
COMMANDS: dict[str, tuple[str, str, str]] = {
    "check": (
        "ckptflow.check_cli",
        "main",
        "what would hang or be rejected on a cluster, before submit",
    ),
    "ckpt": (
        "ckptflow.ckpt_cli",
        "main",
        "inspect, verify, pin, archive and gc checkpoints",
    ),
    "run": (
        "ckptflow.run_cli",
        "main",
        "run a rendered Argo Workflow manifest locally",
    ),
    "plan": (
        "ckptflow.plan_cli",
        "main",
        "checkpoint size, stall, interval, storage cost",
    ),
    "render": ("ckptflow.workflows.render", "main", "render a workflow's manifests (Argo YAML)"),
    "submit": ("ckptflow.workflows.submit", "main", "submit a workflow to the Argo Server (hera)"),
    "generate": (
        "ckptflow.model_cli",
        "generate_main",
        "complete prompts with a checkpoint, an export or a registered model",
    ),
    "evaluate": (
        "ckptflow.model_cli",
        "evaluate_main",
        "exact match of a checkpoint, an export or a registered model on a task",
    ),
    "hf-export": (
        "ckptflow.model_cli",
        "hf_export_main",
        "a checkpoint or model as a folder transformers loads (GPT-2)",
    ),
}


COMMON = """common paths:
  ckptflow run pipeline --local                 train, fine-tune, select here (a few minutes)
  ckptflow run pipeline --local -p ranks=3      ... with a workflow parameter changed
  ckptflow ckpt ls runs/NAME/pretrain/ckpt      the checkpoints of a run (--verify: every byte)
  ckptflow ckpt gc ROOT --policy last=3         what a retention policy deletes (dry run)
  ckptflow render pipeline -o pipeline.yaml     the Argo manifest (--template: WorkflowTemplate)
  ckptflow submit pipeline --wait               send it to the Argo Server
  ckptflow render --keys                        every --set setting and its default
run `ckptflow COMMAND --help` for a command's options"""


def version() -> str:
    """The installed distribution's version."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("ckptflow")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


def _usage() -> str:
    lines = ["usage: ckptflow [--version] COMMAND [ARGS...]", "", "commands:"]
    width = max(map(len, COMMANDS))
    lines += [f"  {name:<{width}} {help_}" for name, (_, _, help_) in sorted(COMMANDS.items())]
    return "\n".join([*lines, "", COMMON])


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the subcommand named by the first argument."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        print(f"ckptflow {version()}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(
            f"ckptflow: unknown command {name!r}: use one of {', '.join(sorted(COMMANDS))} "
            "(see `ckptflow --help`)",
            file=sys.stderr,
        )
        return 2
    module, func, _ = COMMANDS[name]
    try:
        return int(getattr(importlib.import_module(module), func)(rest) or 0)
    except KeyboardInterrupt:
        print(f"ckptflow {name}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        # A path or file the user gave that cannot be used: one line, the usage exit code
        # (classified by type in one table: cli_errors.py).
        from ckptflow import cli_errors

        line = cli_errors.user_error(exc)
        if line is not None:
            print(f"ckptflow {name}: {line}", file=sys.stderr)
            return cli_errors.USAGE_EXIT
        # A subcommand names every mistake a user can make; what reaches here is a bug or an
        # unforeseen failure: one line (a traceback helps only whoever debugs it).
        from ckptflow import env

        if env.debug():
            raise
        print(
            f"ckptflow {name}: unexpected error: {type(exc).__name__}: {exc} "
            "(rerun with CKPTFLOW_DEBUG=1 for the traceback)".replace("\n", " "),
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())

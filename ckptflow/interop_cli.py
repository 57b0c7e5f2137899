"""`ckptflow ckpt import` and `ckptflow ckpt export`: their subparsers (registered by
ckptflow.ckpt_cli, as ckpt_ops_cli and inspect_cli register theirs) and the two commands, the
ones of `ckptflow ckpt` that need torch (DCP, torch.save and safetensors readers live on the
torch side of the engine, ckptflow.steps.checkpoint.interop). This module imports torch only
inside those two commands, never at import time, so every other `ckptflow ckpt` command stays
torch-free (tests/core/test_no_torch.py runs them and checks).
"""

from __future__ import annotations

import argparse
import json

from ckptflow.contract import cli_args

_SIZE = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE.update({"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40})


def _size(text: str) -> int:
    """argparse type: a size such as 5GB, 500MiB or 1048576 (bytes)."""
    num = text.strip().rstrip("BbIiKkMmGgTt")
    unit = text.strip()[len(num) :].lower()
    try:
        value = int(float(num) * _SIZE[unit])
    except (KeyError, ValueError):
        value = 0
    if not 1 <= value <= 1 << 50:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: give e.g. 5GB, 500MiB or 1048576")
    return value


def add_parsers(sub) -> None:
    """The `import` and `export` subparsers."""
    i = sub.add_parser("import", help="bring a DCP, torch.save or safetensors checkpoint in")
    i.add_argument(
        "src", help="DCP folder, torch.save file, safetensors file/folder, ckptflow root"
    )
    i.add_argument("--to", required=True, help="the ckptflow root to write the step into")
    i.add_argument("--step", type=cli_args.step, help="step number (default: the source's, or 0)")
    i.add_argument("--json", action="store_true", help="print the report as JSON")
    e = sub.add_parser("export", help="write a step as Hugging Face, DCP or torch.save files")
    e.add_argument("root")
    e.add_argument("--step", type=cli_args.step, help="the step (default: the newest valid)")
    e.add_argument("--format", required=True, choices=("hf", "dcp", "torch"))
    e.add_argument(
        "--to", required=True, help="a new or empty folder, or an earlier export (replaced)"
    )
    e.add_argument("--dtype", choices=("bf16", "fp32"), help="convert floating tensors")
    part = e.add_mutually_exclusive_group()
    part.add_argument(
        "--model-only", action="store_true", help="the model's weights only (hf: the default)"
    )
    part.add_argument(
        "--full-state",
        action="store_true",
        help="hf: every tensor of the training state, optimizer too (dcp, torch: the default)",
    )
    e.add_argument("--shard-size", type=_size, default=5 * 10**9, help="per file (hf, dcp): 5GB")
    e.add_argument("--json", action="store_true", help="print the report as JSON")


def _report(report, as_json: bool) -> int:
    print(json.dumps(report.as_dict(), indent=1) if as_json else "\n".join(report.lines()))
    return 0


def cmd_import(args) -> int:
    from ckptflow.steps.checkpoint.interop import import_checkpoint  # torch, only here

    return _report(import_checkpoint(args.src, args.to, step=args.step), args.json)


def cmd_export(args) -> int:
    from ckptflow.steps.checkpoint.interop import export_checkpoint  # torch, only here

    report = export_checkpoint(
        args.root,
        args.to,
        step=args.step,
        fmt=args.format,
        dtype=args.dtype,
        model_only=True if args.model_only else False if args.full_state else None,
        shard_bytes=args.shard_size,
    )
    return _report(report, args.json)

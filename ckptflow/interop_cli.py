"""`ckptflow ckpt import` and `ckptflow ckpt export`: the two commands of `ckptflow ckpt` that
need torch (DCP, torch.save and safetensors readers live on the torch side of the engine,
ckptflow.steps.checkpoint.interop). `ckpt_cli` imports this module only when one of them runs,
so every other `ckptflow ckpt` command stays torch-free.
"""

from __future__ import annotations

import json


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

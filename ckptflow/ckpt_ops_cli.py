"""`ckptflow ckpt slim` and `ckptflow ckpt stats`: the operations subcommands of `ckpt`
(registered by ckptflow.ckpt_cli).

    ckptflow ckpt slim ROOT --older-than 7d [--keep PREFIX ...] [--yes] [--json]
    ckptflow ckpt stats ROOT [--json]
    ckptflow ckpt roots STORAGE_ROOT [--json]
"""

from __future__ import annotations

import argparse
import json

from ckptflow import env
from ckptflow.core import listing, rootguess, rootreader


def add_parsers(sub, duration) -> None:
    """The `slim` and `stats` subparsers (`duration`: ckpt_cli's argparse duration type)."""
    s = sub.add_parser("slim", help="keep old steps as weights only (dry run)")
    s.add_argument("root")
    s.add_argument("--older-than", type=duration, required=True, help="e.g. 7d")
    s.add_argument(
        "--keep",
        nargs="+",
        default=["model", "step"],
        metavar="PREFIX",
        help="FQN prefixes kept (default: model step); the rest (optim, rng, data) goes",
    )
    s.add_argument("--yes", action="store_true", help="really slim (default: dry run)")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    t = sub.add_parser("stats", help="checkpoint health: rates, stalls, bytes, RPO, recoveries")
    t.add_argument("root")
    t.add_argument("--json", action="store_true", help="print JSON")
    r = sub.add_parser("roots", help="the checkpoint roots under a storage root (retention)")
    r.add_argument("root", help="storage root, e.g. s3://ckptflow/runs")
    r.add_argument("--json", action="store_true", help="print a JSON list (Argo's withParam)")


def cmd_slim(args: argparse.Namespace) -> int:
    from ckptflow.core.slim import slim

    report = slim(
        args.root,
        args.older_than,
        keep=tuple(args.keep),
        apply=args.yes,
        storage=env.open_storage(args.root),
    )
    print(json.dumps(report.as_dict(), indent=1) if args.json else "\n".join(report.lines()))
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from ckptflow.core import health_stats as health

    st = listing.open_root(args.root, env.open_storage(args.root))
    stats = health.stats(st)
    print(json.dumps(stats, indent=1, sort_keys=True) if args.json else health.render(stats))
    return 0


def cmd_roots(args: argparse.Namespace) -> int:
    """Every checkpoint root with a committed step under the storage root: what the retention
    CronWorkflow collects (a root still waiting for its first commit is left for later). None
    is a mistake (a wrong storage root), never an empty success."""
    from ckptflow.core.errors import CheckpointError

    found = rootguess.find_roots(env.open_storage(args.root))
    roots = [r for r in found if rootreader.committed_steps(env.open_storage(r))]
    if not roots:
        raise CheckpointError(
            f"no checkpoint root with a committed step under {args.root}; check the storage root"
        )
    print(json.dumps(roots) if args.json else "\n".join(roots))
    return 0


COMMANDS = {"slim": cmd_slim, "stats": cmd_stats, "roots": cmd_roots}

"""`ckptflow ckpt`: list, verify, pin, collect and archive the checkpoints of a root.

    ckptflow ckpt ls ROOT [--json] [--verify]
    ckptflow ckpt inspect ROOT STEP [--json]
    ckptflow ckpt verify ROOT [--step N | --all]
    ckptflow ckpt pin ROOT STEP [--reason TEXT]
    ckptflow ckpt unpin ROOT STEP
    ckptflow ckpt gc ROOT --policy SPEC [--grace 1h] [--yes] [--json]
    ckptflow ckpt archive ROOT --older-than 7d --to URI [--grace 1h] [--yes] [--json]
    ckptflow ckpt repair ROOT [--yes]
    ckptflow ckpt slim ROOT --older-than 7d [--keep PREFIX ...] [--yes] [--json]
    ckptflow ckpt stats ROOT [--json]
    ckptflow ckpt import SRC --to ROOT [--step N]
    ckptflow ckpt export ROOT [--step N] --format hf|dcp|torch --to URI [--dtype bf16|fp32]
                         [--model-only | --full-state] [--shard-size 5GB]

ROOT is a local path or s3://bucket/prefix. SRC is a DCP folder, a torch.save file, Hugging
Face safetensors (a file or a folder) or a ckptflow root. gc and archive are dry runs unless --yes. Exit codes:
0 success, 1 a verification found bad data, 2 a usage error (the message names the fix).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ckptflow import ckpt_ops_cli, env, inspect_cli, interop_cli
from ckptflow.contract import cli_args
from ckptflow.core import drill, layout, listing, rootreader, runroot
from ckptflow.core.errors import CheckpointError, CorruptCheckpoint
from ckptflow.core.policy_syntax import PolicyError, parse_duration
from ckptflow.core.progress import Progress
from ckptflow.core.retention import POLICY_EXAMPLE
from ckptflow.core.storage_errors import StorageError, classify

_H = listing.human_bytes


def _duration(text: str) -> float:
    """argparse type: a duration such as 1h, or 0 for none."""
    if text.strip().rstrip("smhdw") in ("0", "0.0"):
        return 0.0
    try:
        return parse_duration(text)
    except PolicyError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


EXAMPLES = """ROOT is a checkpoint root: a run's ckpt/ folder, e.g.
  ckptflow ckpt ls runs/NAME/pretrain/ckpt
  ckptflow ckpt ls runs/NAME/finetune/VARIANT/ckpt --verify
  ckptflow ckpt verify s3://bucket/runs/NAME/pretrain/ckpt --step 40
  ckptflow ckpt gc runs/NAME/pretrain/ckpt --policy last=3,best=val_loss:min:1
exit codes: 0 ok, 1 bad data found (verify, ls --verify), 2 a usage error"""


LS_COLUMNS = """columns:
  STEP     training step; STATE committed, corrupt or uncommitted (a save in progress or
           crashed); AGE since its commit
  KIND     full; delta<N: stores only what changed since step N (its base, kept while the
           delta is); deduplicated: a full step whose bytes mostly exist already
  LOGICAL  the tensors' and values' bytes as loaded (uncompressed)
  STORED   bytes on storage this step needs to load: its own objects and, for a delta,
           its base's (shared objects counted in every step that needs them)
  NEW      bytes this save wrote (objects that did not exist before it)
  RATIO    LOGICAL / STORED: above 1x, compression and sharing saved space; a delta's
           can be below 1x, as its base's bytes count in its STORED
  COMPRESSED  MODE/SHARE: the save's compression mode and the share of LOGICAL stored
           compressed. Modes: auto:always (object storage, billed by the byte: `auto`
           compresses every part there), auto:adaptive (local disk or memory: compressed
           where it made the save faster), on, off (forced); `-`: saved before ckptflow
           recorded it
  PIN      pinned: never deleted by a policy; TIER hot, or archive (moved by `archive`)
  METRICS  the step's evaluation (eval.json), when it was evaluated
a delta stores the changed bytes' planes; weights an optimizer moved change in every low
mantissa byte, so their deltas can be as large as a full step (docs/format.md, deltas)"""


def build_parser() -> argparse.ArgumentParser:
    p = cli_args.Parser(
        prog="ckptflow ckpt",
        description=__doc__.split("\n\n")[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    ls = sub.add_parser(
        "ls",
        help="one row per step: kind, sizes, state, pin, tier, metrics",
        epilog=LS_COLUMNS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ls.add_argument("root", help="checkpoint root: a local path or s3://bucket/prefix")
    ls.add_argument("--json", action="store_true", help="print JSON rows for scripts")
    ls.add_argument("--verify", action="store_true", help="read every byte (slow; finds bit rot)")
    v = sub.add_parser("verify", help="check every byte against the manifests")
    v.add_argument("root")
    which = v.add_mutually_exclusive_group()
    which.add_argument("--step", type=cli_args.step, help="verify this step only")
    which.add_argument("--all", action="store_true", help="verify every committed step (default)")
    for name, helptext in (("pin", "never delete STEP by any policy"), ("unpin", "undo pin")):
        q = sub.add_parser(name, help=helptext)
        q.add_argument("root")
        q.add_argument("step", type=cli_args.step)
        if name == "pin":
            q.add_argument("--reason", default="", help="why (e.g. 'published as v3')")
    g = sub.add_parser("gc", help="delete what a retention policy does not keep (dry run)")
    g.add_argument("root")
    g.add_argument("--policy", required=True, help=f"retention policy, e.g. {POLICY_EXAMPLE}")
    g.add_argument("--grace", type=_duration, default=3600.0, help="leave younger files (1h)")
    g.add_argument("--yes", action="store_true", help="really delete (default: dry run)")
    g.add_argument("--json", action="store_true", help="print the report as JSON")
    a = sub.add_parser("archive", help="move old steps to an archive root (dry run)")
    a.add_argument("root")
    a.add_argument("--older-than", type=_duration, required=True, help="e.g. 7d")
    a.add_argument("--to", required=True, help="archive root: another bucket or prefix")
    a.add_argument("--grace", type=_duration, default=3600.0, help="leave younger objects (1h)")
    a.add_argument("--yes", action="store_true", help="really archive (default: dry run)")
    a.add_argument("--json", action="store_true", help="print the report as JSON")
    r = sub.add_parser("repair", help="restore a lost or damaged root marker (dry run)")
    r.add_argument("root")
    r.add_argument("--yes", action="store_true", help="really write it (default: dry run)")
    ckpt_ops_cli.add_parsers(sub, _duration)
    inspect_cli.add_parsers(sub)
    interop_cli.add_parsers(sub)
    return p


def _open(uri: str):
    """The checkpoint root at `uri`, reached the way this deployment is wired (ckptflow.env)."""
    return listing.open_root(uri, env.open_storage(uri))


# -- ls --------------------------------------------------------------------------------------------
def _metrics_text(metrics: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())) or "-"


def _compressed_text(r: listing.StepRow) -> str:
    """e.g. `auto:always/100%`: why and how much of the step was stored compressed (one
    word: a column scripts may split on)."""
    share = r.compressed_share
    return "-" if share is None else f"{r.compression}/{100 * share:.0f}%"


def _table(rows: list[listing.StepRow]) -> list[str]:
    head = ("STEP", "STATE", "AGE", "KIND", "LOGICAL", "STORED", "NEW", "RATIO", "COMPRESSED")
    head = (*head, "PIN", "TIER", "METRICS")
    body = []
    for r in rows:
        kind = r.kind or "-"
        if r.kind == "delta":
            kind = f"delta<{r.base_step}"
        if r.slimmed_at is not None:
            kind += ",slim"
        done = r.state != "uncommitted"
        body.append(
            (
                str(r.step),
                r.state,
                listing.human_age(r.age_s),
                kind,
                _H(r.logical_bytes) if done else "-",
                _H(r.stored_bytes) if done else "-",
                _H(r.new_bytes) if done else "-",
                f"{r.ratio:.2f}x" if r.ratio else "-",
                _compressed_text(r),
                "pinned" if r.pinned else "-",
                r.tier,
                _metrics_text(r.metrics),
            )
        )
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(x, widths, strict=True)).rstrip()
        for x in [head, *body]
    ]
    for r in rows:
        lines += [f"  step {r.step}: bad file {p}" for p in r.problems]
    return lines


def _warn_marker(st) -> None:
    """Reads go on past a lost or damaged root marker (the steps agree on the root id), but
    the user must hear of it: changes to the root are refused until it is repaired."""
    problem = rootreader.marker_problem(st)
    if problem:
        print(f"warning: {problem}", file=sys.stderr)


def cmd_ls(args) -> int:
    st = _open(args.root)
    _warn_marker(st)
    rows = listing.build_rows(st, now=time.time(), check=True, deep=args.verify)
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=1, sort_keys=True))
    elif not rows:
        print(f"no checkpoints under {st.uri}")
    else:
        print("\n".join(_table(rows)))
    corrupt = [r.step for r in rows if r.state == "corrupt"]
    if corrupt and args.verify:  # reading every byte found bad data: exit 1, as `verify` does
        print(f"{len(corrupt)} corrupt step(s): {', '.join(map(str, corrupt))}", file=sys.stderr)
        return 1
    return 0


# -- verify ----------------------------------------------------------------------------------------
def cmd_verify(args) -> int:
    st = _open(args.root)
    _warn_marker(st)
    steps = rootreader.committed_steps(st)
    if args.step is not None:
        if args.step not in steps:
            raise CheckpointError(
                f"step {args.step} is not a committed checkpoint under {st.uri}; "
                f"committed steps: {steps or 'none'} (see `ckptflow ckpt ls {args.root}`)"
            )
        steps = [args.step]
    if not steps:
        raise CheckpointError(f"no committed checkpoints under {st.uri} to verify")
    n_bad = 0
    for step in steps:
        with Progress(0, desc=f"verify step {step}", nbytes=True) as prog:
            m, bad = drill.verify_recorded(st, step, "verify", progress=prog.add)
        if bad:
            n_bad += 1
            print(f"step {step}: CORRUPT")
            for b in bad:
                print(f"  bad file {b}")
        else:
            print(
                f"step {step}: ok ({len(m['objects'])} objects, {_H(m['stats']['stored_bytes'])})"
            )
    print(f"{len(steps)} step(s) verified: " + (f"{n_bad} corrupt" if n_bad else "all sound"))
    return 1 if n_bad else 0


# -- pin / unpin -----------------------------------------------------------------------------------
def _committed(st, step: int) -> None:
    if not st.exists(layout.commit_path(step)):
        raise CheckpointError(
            f"step {step} is not a committed checkpoint under {st.uri}; committed steps: "
            f"{rootreader.committed_steps(st) or 'none'}"
        )


def cmd_pin(args) -> int:
    st = _open(args.root)
    _committed(st, args.step)
    runroot.pin(st, args.step, args.reason)
    print(f"pinned step {args.step}" + (f" ({args.reason})" if args.reason else ""))
    return 0


def cmd_unpin(args) -> int:
    st = _open(args.root)
    if not runroot.unpin(st, args.step):
        _committed(st, args.step)
        print(f"step {args.step} was not pinned")
        return 0
    print(f"unpinned step {args.step}: retention policies may delete it now")
    return 0


# -- gc / archive ----------------------------------------------------------------------------------
def cmd_gc(args) -> int:
    from ckptflow.core.gc import gc, parse_policy

    policy = parse_policy(args.policy)  # a bad policy is named before the root is read
    # A root that does not exist or holds no checkpoint is a mistake (a wrong URI): "nothing
    # was deleted" would let retention silently do nothing. The retention CronWorkflow
    # collects the roots `ckptflow ckpt roots` finds, each with a committed step.
    storage = _open(args.root)
    if not rootreader.step_names(storage):
        raise CheckpointError(
            f"{storage.uri} holds no checkpoint: nothing to collect; check the root URI"
        )
    report = gc(args.root, policy, apply=args.yes, grace_s=args.grace, storage=storage)
    print(json.dumps(report.as_dict(), indent=1) if args.json else "\n".join(report.lines()))
    return 0


def cmd_archive(args) -> int:
    from ckptflow.core.archive import archive

    report = archive(
        args.root,
        args.to,
        args.older_than,
        apply=args.yes,
        grace_s=args.grace,
        progress=True,  # a bar on a terminal, else a line every few seconds
        storage=env.open_storage(args.root),
        dest=env.open_storage(args.to),
    )
    print(json.dumps(report.as_dict(), indent=1) if args.json else "\n".join(report.lines()))
    return 0


def cmd_repair(args) -> int:
    st = _open(args.root)
    root_id, n = rootreader.restore_marker(st, apply=args.yes)
    if root_id is None:
        print(f"{st.url(layout.ROOT_MARKER)} is whole: nothing to repair")
        return 0
    verb = "restored" if args.yes else "would restore"
    print(
        f"{verb} {st.url(layout.ROOT_MARKER)}: root id {root_id}, agreed by {n} committed step(s)"
    )
    print("  a fine-tune's parent root is not recorded in the steps: check `ckptflow ckpt verify`")
    if not args.yes:
        print("dry run: nothing was written; add --yes to restore it")
    return 0


_VALUE_OPTIONS = {
    "--grace",
    "--older-than",
    "--step",
    "--policy",
    "--to",
    "--reason",
    "--keep",
    "--shard-size",
}

COMMANDS = {
    "ls": cmd_ls,
    "verify": cmd_verify,
    "pin": cmd_pin,
    "unpin": cmd_unpin,
    "gc": cmd_gc,
    "archive": cmd_archive,
    "repair": cmd_repair,
    **ckpt_ops_cli.COMMANDS,
    "inspect": inspect_cli.cmd_inspect,
    "import": interop_cli.cmd_import,  # torch is imported there, for these two commands only
    "export": interop_cli.cmd_export,
}


def main(argv: list[str] | None = None) -> int:
    """Run one `ckptflow ckpt` subcommand; user errors print one line and return 2."""
    args = cli_args.parse(build_parser(), argv, _VALUE_OPTIONS)
    if isinstance(args, int):  # argparse already printed the problem (or the help)
        return args
    try:
        return COMMANDS[args.cmd](args)
    except CorruptCheckpoint as exc:
        print(f"ckptflow ckpt {args.cmd}: corrupt checkpoint: {exc}", file=sys.stderr)
        return 1
    except (CheckpointError, StorageError, PolicyError) as exc:
        print(f"ckptflow ckpt {args.cmd}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if not _unreachable(exc):
            raise
        print(
            f"ckptflow ckpt {args.cmd}: error: cannot reach the storage of "
            f"{getattr(args, 'root', None) or args.src} ({exc}); "
            "check the URI, AWS_ENDPOINT_URL and the network",
            file=sys.stderr,
        )
        return 2


def _unreachable(exc: BaseException) -> bool:
    """A storage endpoint that does not answer (wrong endpoint URL, network down)."""
    return classify(exc) == "unreachable"


if __name__ == "__main__":
    sys.exit(main())

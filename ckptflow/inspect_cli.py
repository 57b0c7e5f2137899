"""`ckptflow ckpt inspect ROOT STEP [--json]`: what one committed step holds.

Tensors (name, shape, dtype, logical and stored bytes), non-tensor values (name and stored
bytes: their contents are pickles, never unpickled here) and metadata of one step, read with
the format core's validating reader (`rootreader.read_manifest`: bounded, every field checked,
a damaged manifest named), so what is printed is what a load would read. Torch-free.
"""

from __future__ import annotations

import argparse
import json
import math
import time

from ckptflow import env
from ckptflow.contract import cli_args
from ckptflow.core import listing, locator, rootreader, runroot
from ckptflow.core import manifest as mf
from ckptflow.core.errors import CheckpointError

__all__ = ["add_parsers", "cmd_inspect", "describe"]


def add_parsers(sub) -> None:
    i = sub.add_parser("inspect", help="tensors, shapes, dtypes, values and metadata of a step")
    i.add_argument("root", help="checkpoint root: a local path or s3://bucket/prefix")
    i.add_argument("step", type=cli_args.step, help="a committed step (see `ckpt ls ROOT`)")
    i.add_argument("--json", action="store_true", help="print JSON for scripts")


def _bytes_of(items: list[dict]) -> tuple[int, int, int]:
    """(raw, stored, base) bytes of an entry's items: its parts' stored bytes (a packed part's
    span, not its whole pack) and, for a delta, those of the base parts it is applied to."""
    raw = stored = base = 0
    for rec in items:
        for p in rec["parts"]:
            raw += p["raw_size"]
            stored += mf.part_bytes(p)
            base += mf.part_bytes(p["base"]) if p.get("base") else 0
    return raw, stored, base


def describe(storage, step: int) -> dict:
    """One committed step as a plain dict (see the module doc); CheckpointError (NotCommitted)
    for a step that is not committed, CorruptCheckpoint naming a damaged file."""
    where = locator.locate(storage, step)  # an archived step is read from its archive copy
    m = rootreader.read_manifest(where, step)
    by_fqn: dict[str, list[dict]] = {}
    for rec in m["items"].values():
        by_fqn.setdefault(rec["fqn"], []).append(rec)
    tensors = {}
    for fqn, t in sorted(m["tensors"].items()):
        raw, stored, base = _bytes_of(by_fqn.get(fqn, []))
        tensors[fqn] = {
            "shape": list(t["size"]),
            "dtype": t["dtype"],
            "raw_bytes": raw,
            "stored_bytes": stored,
            "base_bytes": base,
        }
    values = {}
    for fqn in sorted(m["values"]):
        raw, stored, _ = _bytes_of(by_fqn.get(fqn, []))
        values[fqn] = {"raw_bytes": raw, "stored_bytes": stored}
    try:
        rec = runroot.read_eval(storage, step)
        metrics = {k: v for k, v in (rec.metrics if rec else {}).items() if not math.isnan(v)}
    except runroot.RecordError:  # a damaged record: the checkpoint itself is sound
        metrics = {}
    return {
        "root": where.uri,
        "step": step,
        "kind": m["kind"],
        "base_step": m.get("base_step"),
        "save_id": m["save_id"],
        "created_at": m["created_at"],
        "world_size": m["world_size"],
        "library": m.get("library", {}),
        "stats": m["stats"],
        "slimmed": m.get("slimmed"),
        "metadata": m["metadata"],
        "metrics": metrics,
        "tensors": tensors,
        "values": values,
    }


def render(d: dict) -> str:
    """The description as text: a header, one row per tensor, the values, the metadata."""
    h = listing.human_bytes
    kind = f"delta of step {d['base_step']}" if d["kind"] == "delta" else d["kind"]
    created = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(d["created_at"]))
    st = d["stats"]
    lines = [
        f"step {d['step']} of {d['root']}: {kind}, saved {created} by {d['world_size']} rank(s)",
        f"  logical {h(st['raw_bytes'])}, stored {h(st['stored_bytes'])}, "
        f"new {h(st['new_bytes'])}" + (", slimmed (weights only)" if d["slimmed"] else ""),
        "  metrics: " + (" ".join(f"{k}={v:.4g}" for k, v in sorted(d["metrics"].items())) or "-"),
    ]
    rows = [("TENSOR", "SHAPE", "DTYPE", "LOGICAL", "STORED", "BASE")]
    for name, t in d["tensors"].items():
        base = h(t["base_bytes"]) if t["base_bytes"] else "-"
        rows.append(
            (name, str(t["shape"]), t["dtype"], h(t["raw_bytes"]), h(t["stored_bytes"]), base)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    lines.append(f"{len(d['tensors'])} tensor(s); values (not unpickled):")
    lines += [f"  {k}  {h(v['stored_bytes'])}" for k, v in d["values"].items()] or ["  -"]
    lines.append(
        "metadata: " + (json.dumps(d["metadata"], sort_keys=True) if d["metadata"] else "-")
    )
    return "\n".join(lines)


def cmd_inspect(args: argparse.Namespace) -> int:
    st = listing.open_root(args.root, env.open_storage(args.root))
    steps = rootreader.committed_steps(st)
    if args.step not in steps:
        raise CheckpointError(
            f"step {args.step} has no committed checkpoint under {st.uri}; committed steps: "
            f"{steps or 'none'} (see `ckptflow ckpt ls {args.root}`)"
        )
    d = describe(st, args.step)
    print(json.dumps(d, indent=1, sort_keys=True) if args.json else render(d))
    return 0

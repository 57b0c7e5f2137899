"""Weights-only demotion of old checkpoints (`ckptflow ckpt slim`, the `slim=AGE` policy term).

A slimmed step keeps the entries under the kept FQN prefixes (default: `model` and `step`) and
drops the rest: optimizer state, scheduler, RNG states, data position. It is written as a new
manifest with the commit protocol's rules (docs/format.md "Slimmed steps"): the manifest
`manifest-<slim_id>.json` is written and validated first, then `SLIM` naming it (with its
checksum and the save it came from) is created exclusively, so a crash leaves either the
full step or the slimmed one, never a torn mix, and of two racing slims exactly one wins.
Nothing is deleted here: GC then frees the objects no manifest references any more (the
original manifest's objects are kept for the grace period, as a reader may still be loading
them). A delta's own manifest keeps referencing its base's objects, so deltas whose base was
slimmed still load in full.

Never slimmed: the latest valid step and the base of the latest delta (a running job saves
deltas against that base and deduplicates against the latest), pinned, archived (slim the
archive root itself), corrupt or uncommitted steps.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field

from ckptflow.core import codec, health, layout, listing, marks, rootreader
from ckptflow.core import manifest as mf
from ckptflow.core.errors import CheckpointError, SlimmedCheckpoint
from ckptflow.core.storage import Storage

DEFAULT_KEEP = ("model", "step")


def kept(fqn: str, keep: tuple[str, ...]) -> bool:
    """True when an FQN lies under one of the kept prefixes (`model` keeps `model.w`)."""
    return any(fqn == p or fqn.startswith(p + ".") for p in keep)


def slim_manifest(
    m: dict, keep: tuple[str, ...], slim_id: str, of_save_id: str, now: float
) -> dict | None:
    """The weights-only manifest of `m`, or None when it drops nothing (already weights only).
    CheckpointError when it would keep no tensor (the prefixes match nothing)."""
    tensors = {f: t for f, t in m["tensors"].items() if kept(f, keep)}
    values = [f for f in m["values"] if kept(f, keep)]
    dropped = len(m["tensors"]) - len(tensors) + len(m["values"]) - len(values)
    if not dropped:
        return None
    if not tensors:
        raise CheckpointError(
            f"step {m['step']}: no tensor lies under {', '.join(keep)}; nothing was slimmed "
            "(name the weights' prefix with --keep)"
        )
    items = {k: it for k, it in m["items"].items() if kept(it["fqn"], keep)}
    objects = {}
    for it in items.values():
        for p in it["parts"]:
            for ref in (p, p["base"]):  # a delta keeps its base's objects
                if ref is not None:
                    objects[ref["object"]] = m["objects"][ref["object"]]
    stored = sum(o["size"] for o in objects.values())
    raw = sum(p["raw_size"] for it in items.values() for p in it["parts"])
    pd = m.get("planner_data")
    out = dict(m)
    out.update(
        tensors=tensors,
        values=values,
        items=items,
        objects=objects,
        planner_data=None if pd is None else {k: v for k, v in pd.items() if kept(k, keep)},
        stats={
            "raw_bytes": raw,
            "stored_bytes": stored,
            "new_bytes": min(m["stats"]["new_bytes"], stored),
        },
        slimmed={
            "slim_id": slim_id,
            "of_save_id": of_save_id,
            "at": now,
            "kept": list(keep),
            "dropped_entries": dropped,
            "dropped_bytes": m["stats"]["stored_bytes"] - stored,
        },
    )
    return out


def slim_step(st: Storage, step: int, keep: tuple[str, ...], now: float) -> dict | None:
    """Slim one committed step (manifest, then SLIM exclusively). The new manifest, or None
    when there was nothing to drop or another slim won the race."""
    commit = rootreader.read_commit(st, step)
    m = rootreader.read_manifest(st, step)
    if m.get("slimmed"):
        return None
    slim_id = uuid.uuid4().hex[:16]
    new = slim_manifest(m, keep, slim_id, commit["save_id"], now)
    if new is None:
        return None
    blob = mf.dumps(new)
    mf.parse(blob)  # never name a manifest every reader would refuse
    sd = layout.step_dir(step)
    st.write(f"{sd}/{layout.manifest_name(slim_id)}", blob)  # named by nothing until SLIM
    doc = {
        "save_id": slim_id,
        "manifest_xxh3": codec.digest(blob),
        "of_save_id": commit["save_id"],
        "slimmed_at": now,
        "root_id": m["root_id"],
    }
    return new if marks.write_slim(st, step, doc) else None


@dataclass
class SlimReport:
    """What `ckpt slim` would slim (dry run) or slimmed, and the bytes GC then frees."""

    root: str
    older_than_s: float
    keep: list[str]
    applied: bool
    slimmed: dict[int, int] = field(default_factory=dict)  # step -> stored bytes it drops
    skipped: dict[int, str] = field(default_factory=dict)  # old step -> why it stays whole
    bytes_before: int = 0  # stored bytes of the hot root's referenced objects
    bytes_after: int = 0  # the same once slimmed: GC frees the difference
    full_state_steps: list[int] = field(default_factory=list)  # steps that still resume

    def as_dict(self) -> dict:
        d = asdict(self)
        d["slimmed"] = {str(k): v for k, v in self.slimmed.items()}
        d["skipped"] = {str(k): v for k, v in self.skipped.items()}
        d["bytes_freed_by_gc"] = self.bytes_before - self.bytes_after
        return d

    def lines(self) -> list[str]:
        verb = "slimmed" if self.applied else "would slim"
        h = listing.human_bytes
        out = [f"slim {self.root}  older than {listing.human_age(self.older_than_s)}"]
        out += [f"  {verb} step {s:>10}  (-{h(b)})" for s, b in sorted(self.slimmed.items())]
        out += [f"  kept whole step {s:>10}  ({why})" for s, why in sorted(self.skipped.items())]
        out.append(
            f"{verb} {len(self.slimmed)} step(s): stored {h(self.bytes_before)} -> "
            f"{h(self.bytes_after)}; gc frees {h(self.bytes_before - self.bytes_after)}"
        )
        out.append(f"steps with optimizer state: {self.full_state_steps or 'none'}")
        if not self.applied:
            out.append("dry run: nothing was written; add --yes to slim")
        return out


def protected(rows: list[listing.StepRow]) -> dict[int, str]:
    """Steps never slimmed, with why: the latest valid one and the base of the latest."""
    valid = [r for r in rows if r.valid]
    if not valid:
        return {}
    latest = valid[-1]
    out = {latest.step: "latest valid"}
    if latest.base_step is not None:
        out[latest.base_step] = f"base of the latest step {latest.step}"
    return out


def candidates(
    rows: list[listing.StepRow], older_than_s: float
) -> tuple[list[int], dict[int, str]]:
    """(steps to slim, old steps left whole and why)."""
    keep_whole = protected(rows)
    todo, skipped = [], {}
    for r in rows:
        if r.state == "uncommitted" or r.age_s is None or r.age_s <= older_than_s:
            continue
        why = keep_whole.get(r.step)
        why = why or ("already slim" if r.slimmed_at is not None else None)
        why = why or ("corrupt" if r.state == "corrupt" else None)
        why = why or ("pinned" if r.pinned else None)
        why = why or ("archived: slim the archive root" if r.tier == "archive" else None)
        if why and why != "already slim":
            skipped[r.step] = why
        elif not why:
            todo.append(r.step)
    return todo, skipped


def slim(
    root_uri: str,
    older_than_s: float,
    *,
    keep: tuple[str, ...] = DEFAULT_KEEP,
    apply: bool = False,
    now: float | None = None,
    storage: Storage | None = None,
) -> SlimReport:
    """Slim the hot steps older than `older_than_s` (dry run unless `apply`)."""
    if not keep or any(not p or len(p) > 256 for p in keep):
        raise CheckpointError("--keep takes non-empty FQN prefixes, e.g. --keep model step")
    now = time.time() if now is None else now
    st = listing.open_root(root_uri, storage)
    rootreader.require_marker(st)
    rows = listing.build_rows(st, now=now, check=True)
    todo, skipped = candidates(rows, older_than_s)
    report = SlimReport(st.uri, older_than_s, list(keep), apply, skipped=skipped)
    before = referenced_sizes(rows)
    by_step = {r.step: r for r in rows}
    for step in todo:
        m = rootreader.read_manifest(st, step)
        new = slim_manifest(m, keep, "0" * 16, by_step[step].save_id or "0" * 16, now)
        if new is None:
            continue
        if apply:
            new = slim_step(st, step, keep, now)
            if new is None:
                continue
        report.slimmed[step] = new["slimmed"]["dropped_bytes"]
        by_step[step].objects = {k: v["size"] for k, v in new["objects"].items()}
        by_step[step].slimmed_at = now
    after = referenced_sizes(rows)
    report.bytes_before, report.bytes_after = sum(before.values()), sum(after.values())
    report.full_state_steps = [r.step for r in rows if r.valid and r.slimmed_at is None]
    if apply and report.slimmed:
        freed = report.bytes_before - report.bytes_after
        health.record(st, "slim", duration_s=max(0.0, time.time() - now), bytes=freed)
    return report


def referenced_sizes(rows: list[listing.StepRow]) -> dict[str, int]:
    """Stored size of every object the hot committed rows reference."""
    out: dict[str, int] = {}
    for r in rows:
        if r.state != "uncommitted" and r.tier == "hot":
            out.update(r.objects)
    return out


def full_state_steps(st: Storage) -> list[int]:
    """Committed, sound steps that still hold everything they were saved with (not slimmed):
    what a resume with optimizer state can load instead."""
    now = time.time()
    return [
        r.step for r in listing.build_rows(st, now=now, check=False) if r.valid and not r.slimmed_at
    ]


def slimmed_error(storage: Storage, step: int, m: dict, exc: Exception) -> SlimmedCheckpoint:
    """What a load into a full training state of a weights-only step says: which step,
    when it was slimmed, what it kept, and which steps still hold everything."""
    s = m["slimmed"]
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(s["at"]))
    full = full_state_steps(storage)
    return SlimmedCheckpoint(
        f"step {step} under {storage.uri} was slimmed to weights only at {when} (kept "
        f"{', '.join(s['kept'])}): it holds no optimizer state, RNG or data position; "
        f"steps with their full state: {full or 'none'}; load one of those, or load only "
        f"the weights from step {step}\n{exc}"
    )

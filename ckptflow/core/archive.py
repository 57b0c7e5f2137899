"""The archive tier: move old checkpoints to another root (bucket or prefix), keep them listed.

For each selected step (bases before the deltas that need them):

1. the archive root gets a root marker with the SAME root id as the hot root (created once), so
   the copied manifests validate there as this run's and not a foreign one's;
2. every object the manifest needs is read (checked against its key), and written there,
   then the manifest, eval.json and, last, COMMIT (the archive step is valid only when whole);
3. the copy is verified: manifest checksum and every object's size and checksum;
4. `ARCHIVED` ({"uri"}) is written in the hot step folder: from then on `locator.locate` sends
   loads of the step to the archive root, and the hot folder keeps COMMIT + manifest + ARCHIVED
   so the step stays listed;
5. hot objects no hot step references any more (and older than the grace) are deleted, with
   the committed steps listed again right before, as in GC.

A crash anywhere leaves either a step still hot (re-run archive: copies are skipped when
present) or an archived step whose hot objects a later `gc` or `archive` frees.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from ckptflow.core import (
    codec,
    gc,
    gc_objects,
    layout,
    listing,
    locator,
    rankmanifest,
    rootreader,
    runroot,
)
from ckptflow.core.errors import CheckpointError, CorruptCheckpoint
from ckptflow.core.progress import Progress
from ckptflow.core.retention import select_for_archive
from ckptflow.core.storage import AlreadyExists, Storage


@dataclass
class ArchiveReport:
    """What an archive run moved (or would move) and what it freed in the hot root."""

    root: str  # the hot root
    to: str  # the archive root
    applied: bool  # False: a dry run
    steps: list[int] = field(default_factory=list)  # steps archived (or to archive)
    bytes_copied: int = 0  # object bytes written to the archive root
    objects: list[str] = field(default_factory=list)  # hot objects freed
    bytes_freed: int = 0  # their bytes
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        verb = "archived" if self.applied else "would archive"
        out = [f"archive {self.root} -> {self.to}"]
        out += [f"  {verb} step {s}" for s in self.steps]
        out += [f"  warning: {w}" for w in self.warnings]
        out.append(
            f"{verb} {len(self.steps)} step(s): {listing.human_bytes(self.bytes_copied)} "
            f"copied, {len(self.objects)} hot object(s), "
            f"{listing.human_bytes(self.bytes_freed)} freed"
        )
        if not self.applied:
            out.append("dry run: nothing was copied or deleted; add --yes to archive")
        return out


@dataclass(frozen=True)
class _Sized:
    """An object known to be in the archive root with this size (verified by copy_step)."""

    size: int


def claim_archive_root(dst: Storage, root_id: str, hot_uri: str, create: bool = True) -> None:
    """Give the archive root the hot root's id (once, when `create`); refuse one that belongs
    to another run (also in a dry run, so the mistake shows before anything is copied)."""
    dst.check_reachable()
    existing = rootreader.read_root_id(dst)
    if existing is None and not create:
        return
    if existing is None:
        doc = {
            "format": layout.ROOT_FORMAT,
            "version": layout.FORMAT_VERSION,
            "root_id": root_id,
            "created_at": time.time(),
            "archive_of": hot_uri,
        }
        with contextlib.suppress(AlreadyExists):
            dst.write(layout.ROOT_MARKER, json.dumps(doc).encode(), exclusive=True)
        existing = rootreader.read_root_id(dst)
    if existing != root_id:
        raise CheckpointError(
            f"{dst.uri} holds checkpoints of another run (root id {existing}, this run's is "
            f"{root_id}); archive to an empty prefix or to this run's own archive root"
        )


def refuse_hot_root(st: Storage, dst: Storage, to_uri: str) -> None:
    """Refuse an archive root that is the hot root itself or lies inside it, however it is
    spelled: archiving there would free the objects it just "copied", the only copy. Told by
    where the roots really are (Storage.location: symlinks, `..`, doubled slashes resolved)
    and by the root marker found there: a hot root's own marker (this id, no `archive_of`)
    is the hot root seen through another path (a bind mount, another endpoint) or a copy."""
    fix = "give another bucket or prefix"
    if st.contains(dst):
        raise CheckpointError(
            f"--to {to_uri} is the hot root itself or inside it ({st.uri}, symlinks and `..` "
            f"resolved): {fix}"
        )
    try:
        theirs = rootreader.read_marker(dst)
    except CheckpointError:
        return  # not a root marker: claim_archive_root refuses it with its own message
    mine = rootreader.read_marker(st)
    if (
        theirs is not None
        and mine is not None
        and theirs["root_id"] == mine["root_id"]
        and "archive_of" not in theirs
    ):
        raise CheckpointError(
            f"--to {to_uri} holds this run's hot root marker (root id {mine['root_id']}): it is "
            f"the hot root {st.uri} under another name, or a copy of it; {fix}"
        )


def _copy_object(src: Storage, dst: Storage, key: str, size: int, fallbacks: list) -> int:
    """Copy one object, checking it first (a fine-tune's borrowed objects come from its parent
    root, so the archive copy is self-contained). Returns the bytes written."""
    rel = layout.object_path(key)
    try:
        blob, url = locator.read_object(src, key, fallbacks)
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{src.url(rel)}: data file is missing", [src.url(rel)]) from None
    if len(blob) != size or codec.digest(blob) != key:
        raise CorruptCheckpoint(f"{url}: checksum mismatch (corrupt data file)", [url])
    dst.write(rel, blob)
    return len(blob)


def _copy_rank_manifests(src: Storage, dst: Storage, sd: str, index_blob: bytes, url: str) -> None:
    """The rank manifests a format-5 step index names (the copy is verified afterwards)."""
    for rec in rankmanifest.parse_index(index_blob, url)["ranks"]:
        rel = f"{sd}/{rec['manifest']}"
        dst.write(rel, src.read(rel, limit=rec["bytes"] + 1))


def copy_step(src: Storage, dst: Storage, step: int, present: dict, threads: int = 8) -> int:
    """Copy a committed step (objects, manifest, eval.json, then COMMIT) and verify the copy.
    `present` (key -> Entry) lists the archive's objects; those of the right size are skipped
    (content-addressed: same name and size is this content; the verification reads them)."""
    m = rootreader.read_manifest(src, step)
    sizes = {k: v["size"] for k, v in m["objects"].items()}
    todo = sorted(k for k in sizes if k not in present or present[k].size != sizes[k])
    fallbacks = locator.parent_stores(src)
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ckpt-archive") as pool:
        copied = sum(pool.map(lambda k: _copy_object(src, dst, k, sizes[k], fallbacks), todo))
    sd = layout.step_dir(step)
    commit_blob = src.read(layout.commit_path(step))
    commit = rootreader.parse_commit(commit_blob, src.url(layout.commit_path(step)))
    manifest_rel = f"{sd}/{layout.manifest_name(commit['save_id'])}"
    slimmed = m.get("slimmed")
    with contextlib.suppress(FileNotFoundError):  # (a slimmed step's goes after the grace)
        if commit.get("format_version") == layout.RANKS_VERSION:  # its rank manifests first
            _copy_rank_manifests(src, dst, sd, src.read(manifest_rel), src.url(manifest_rel))
        dst.write(manifest_rel, src.read(manifest_rel))
    if slimmed:  # the weights-only manifest, then its marker, before COMMIT
        slim_rel = f"{sd}/{layout.manifest_name(slimmed['slim_id'])}"
        dst.write(slim_rel, src.read(slim_rel))
        slim_blob = src.read(f"{sd}/{layout.SLIM}")
        with contextlib.suppress(AlreadyExists):
            dst.write(f"{sd}/{layout.SLIM}", slim_blob, exclusive=True)
    with contextlib.suppress(FileNotFoundError):
        dst.write(runroot.eval_path(step), src.read(runroot.eval_path(step)))
    try:
        dst.write(layout.commit_path(step), commit_blob, exclusive=True)
    except AlreadyExists:
        if dst.read(layout.commit_path(step)) != commit_blob:
            raise CheckpointError(
                f"{dst.url(layout.commit_path(step))} is a different save of step {step}; "
                "archive this run to its own archive root"
            ) from None
    _, bad = listing.verify_step(dst, step, threads=threads)
    if bad:
        raise CorruptCheckpoint(f"archive copy of step {step} is bad: " + "; ".join(bad), bad)
    return copied


def _mark_archived(st: Storage, dst: Storage, step: int) -> None:
    """Write the step's ARCHIVED marker with an exclusive create, as COMMIT is: a killed
    archiver leaves no marker or a whole one, never an empty one that reads as damage."""
    marker = {"uri": dst.uri, "archived_at": time.time(), "id": uuid.uuid4().hex}
    rel = f"{layout.step_dir(step)}/{layout.ARCHIVED}"
    try:
        st.write(rel, json.dumps(marker).encode(), exclusive=True)
    except AlreadyExists:
        raise CheckpointError(
            f"{st.url(rel)} appeared while this archive ran (another archiver?); "
            "run one archive per root at a time"
        ) from None


def archive(
    root_uri: str,
    to_uri: str,
    older_than_s: float,
    *,
    apply: bool = False,
    grace_s: float = gc.DEFAULT_GRACE_S,
    now: float | None = None,
    storage: Storage | None = None,
    dest: Storage | None = None,
    progress: bool = False,
) -> ArchiveReport:
    """Archive hot steps older than `older_than_s` to `to_uri` (dry run unless `apply`)."""
    now = time.time() if now is None else now
    grace_s = gc.check_grace(grace_s)
    st = listing.open_root(root_uri, storage)
    dst = dest or st.peer(to_uri)
    rootreader.require_marker(st)
    refuse_hot_root(st, dst, to_uri)  # the archive root gets this id: never a guessed one
    rows = listing.build_rows(st, now=now, check=True)
    chosen = select_for_archive(listing.entries(rows), older_than_s, now)
    by_step = {r.step: r for r in rows}
    report = ArchiveReport(root=st.uri, to=dst.uri, applied=apply, steps=chosen)
    root_id = rootreader.read_root_id(st)
    claim_archive_root(dst, root_id, st.uri, create=apply)
    if not apply:
        report.bytes_copied = sum(by_step[s].stored_bytes for s in chosen)
        return report
    moved: set[str] = set()
    present = listing.list_objects(dst)
    total = sum(by_step[s].stored_bytes for s in chosen)
    with Progress(total, desc="archive", nbytes=True, enabled=progress and bool(chosen)) as bar:
        for step in chosen:  # ascending: a delta's base is archived before it
            report.bytes_copied += copy_step(st, dst, step, present)
            present = {**present, **{k: _Sized(v) for k, v in by_step[step].objects.items()}}
            _mark_archived(st, dst, step)
            by_step[step].tier = "archive"
            moved |= set(by_step[step].objects)
            bar.add(by_step[step].stored_bytes)  # its stored size, copied or already there
    report.objects, report.bytes_freed = gc_objects.free_objects(
        st, rows, set(), now - grace_s, report.warnings, apply=True, only=moved, now=now
    )
    return report

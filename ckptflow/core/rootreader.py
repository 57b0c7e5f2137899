"""Reading a checkpoint root: the root marker, the steps, their commit state and manifests.

Everything here only reads (except `ensure_root`, which claims an empty root). A step is
committed when its COMMIT marker exists; it is valid when the marker names a manifest whose
checksum matches and whose root id is this root's.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import uuid

from ckptflow.core import codec, jsonfile, layout, marks, rankmanifest
from ckptflow.core import manifest as mf
from ckptflow.core.errors import CheckpointError, CorruptCheckpoint, FileMissing, NotCommitted
from ckptflow.core.storage import AlreadyExists, Entry, Storage
from ckptflow.core.uris import OBJECT_STORES

# events: ckptflow.core.health; progress.json: ckptflow.core.liveness (written after the first
# step, possibly before the first save writes the marker)
_KNOWN_TOP = {layout.ROOT_MARKER, layout.OBJECTS, "events", "progress.json"}


MAX_MARKER = 64 << 10  # bytes of a root marker: a few hundred in practice
REPAIR = "restore it with `ckptflow ckpt repair {uri} --yes`"


class RootMarkerError(CheckpointError):
    """The root marker is missing or damaged although the root holds committed steps."""


def read_marker(storage: Storage) -> dict | None:
    """The parsed root marker (bounded read, fields checked); None when absent;
    CheckpointError when it is not one."""
    url = storage.url(layout.ROOT_MARKER)
    try:
        doc = jsonfile.read(storage, layout.ROOT_MARKER, max_bytes=MAX_MARKER)
    except FileNotFoundError:
        return None
    except jsonfile.BadJsonFile as exc:  # bad UTF-8/JSON, too large, deep nesting, huge ints
        raise CheckpointError(f"{url} is not a ckptflow root marker ({exc.reason})") from None
    if (
        not isinstance(doc, dict)
        or doc.get("format") != layout.ROOT_FORMAT
        or not isinstance(doc.get("root_id"), str)
    ):
        raise CheckpointError(f"{url} is not a ckptflow root marker")
    return doc


def read_root_id(storage: Storage) -> str | None:
    """The root id, or None for a root that holds nothing yet; raise for a foreign root.

    The marker is not a single point of failure: when it is missing or damaged but the root
    holds committed steps, the id their commit markers and manifests agree on is returned
    (reads keep working); tools that change the root refuse instead (`require_marker`)."""
    try:
        doc = read_marker(storage)
    except CheckpointError as exc:
        damage: CheckpointError | None = exc
        doc = None
    else:
        damage = None
    if doc is not None:
        return doc["root_id"]
    if damage is None:
        foreign = [
            n for n in storage.listdir() if n not in _KNOWN_TOP and layout.parse_step_dir(n) is None
        ]
        if foreign:
            raise CheckpointError(
                f"{storage.uri} holds something else ({', '.join(foreign[:5])}); "
                "use an empty or ckptflow-owned root for checkpoints"
            )
    agreed = agreed_root_id(storage)
    if agreed is None and damage is not None:
        raise damage
    return agreed


_AGREED: dict[tuple, str | None] = {}  # (root url, committed steps) -> id (steps are immutable)


def agreed_root_id(storage: Storage) -> str | None:
    """The root id every committed step names (commit marker, else manifest); None when the
    root has no committed step. RootMarkerError when they disagree or none can be read."""
    steps = committed_steps(storage)
    if not steps:
        return None
    key = (storage.url(), tuple(steps))
    if key not in _AGREED:
        ids = {step_root_id(storage, s) for s in steps} - {None}
        if len(ids) != 1:
            why = "no committed step can be read" if not ids else "the committed steps disagree"
            raise RootMarkerError(
                f"{storage.url(layout.ROOT_MARKER)} is missing or damaged and {why} on the "
                f"root id ({', '.join(sorted(ids)) or 'none'}); restore the marker from a backup"
            )
        _AGREED.clear()  # one entry is enough: the root in use
        _AGREED[key] = ids.pop()
    return _AGREED[key]


def step_root_id(storage: Storage, step: int) -> str | None:
    """The root id a committed step names (None when it cannot be read): its commit marker's
    `root_id`, or (markers written before that field) its checksum-verified manifest's."""
    try:
        commit = read_commit(storage, step)
        if isinstance(commit.get("root_id"), str):
            return commit["root_id"]
        rel = f"{layout.step_dir(step)}/{layout.manifest_name(commit['save_id'])}"
        blob = storage.read(rel)
        if codec.digest(blob) != commit["manifest_xxh3"]:
            return None
        return mf.parse(blob)["root_id"]
    except (FileNotFoundError, CorruptCheckpoint, mf.ManifestError):
        return None


def marker_problem(storage: Storage) -> str | None:
    """Why the root marker cannot be trusted to change this root (None: it is whole, or the
    root holds no committed step). GC, archive and saves refuse on it: acting on a guessed
    id could delete every step or orphan them under a fresh id."""
    try:
        doc = read_marker(storage)
    except CheckpointError:
        doc, state = None, "damaged"
    else:
        state = "missing"
    steps = committed_steps(storage) if doc is None else []
    if not steps:
        return None
    fix = REPAIR.format(uri=storage.uri)
    return (
        f"the root marker {storage.url(layout.ROOT_MARKER)} is {state} but the root holds "
        f"{len(steps)} committed step(s); nothing was changed: {fix}"
    )


def require_marker(storage: Storage) -> None:
    """Raise RootMarkerError (one line naming the fix) unless the root marker is whole."""
    problem = marker_problem(storage)
    if problem:
        raise RootMarkerError(problem)
    root_id = read_root_id(storage)
    if root_id is not None:
        _check_marker_matches(storage, root_id)


def _check_marker_matches(storage: Storage, root_id: str) -> None:
    """A marker replaced by another run's must not pass: the newest committed step naming a
    root id must name this one, or some older step must (a single foreign step is damage of
    that step, not of the marker). Usually costs one small read."""
    others: set[str] = set()
    # committed steps only (one listing on an object store): a read per junk step folder
    # newer than the committed ones made a save into such a root take a minute (issue 37)
    for step in reversed(committed_steps(storage)):
        found = step_root_id(storage, step)
        if found == root_id:
            return
        if found is not None:
            others.add(found)
    if others:
        raise RootMarkerError(
            f"the root marker {storage.url(layout.ROOT_MARKER)} names root id {root_id}, but "
            f"the committed steps belong to {', '.join(sorted(others))}; nothing was changed: "
            "restore the marker from a backup"
        )


def ensure_root(storage: Storage, parent: dict | None = None) -> str:
    """Return the root id, creating the root marker (exclusively) for a new root.

    `parent` ({"uri", "step", "root_id"}) names a committed step of another root whose objects
    this root's manifests may reference (a fine-tune deduplicated against its base). A root
    that holds committed steps never gets a fresh id: a missing, damaged or replaced marker is
    refused (RootMarkerError), so a save never orphans the steps before it.
    """
    storage.check_reachable()
    require_marker(storage)
    root_id = read_root_id(storage)
    if root_id is not None:
        return root_id
    doc = {
        "format": layout.ROOT_FORMAT,
        "version": layout.FORMAT_VERSION,
        "root_id": uuid.uuid4().hex,
        "created_at": time.time(),
    }
    if parent:
        doc["parent"] = parent
    # Another writer may have created it first: then theirs is used.
    with contextlib.suppress(AlreadyExists):
        storage.write(layout.ROOT_MARKER, json.dumps(doc).encode(), exclusive=True)
    return read_root_id(storage)


def restore_marker(storage: Storage, apply: bool) -> tuple[str | None, int]:
    """Write a missing or damaged root marker again with the root id the committed steps agree
    on (when `apply`). Returns (that id, or None when the marker is whole or the root holds
    no step; the number of committed steps). A fine-tune's `parent` cannot be recovered."""
    if marker_problem(storage) is None:
        return None, 0
    root_id = agreed_root_id(storage)
    steps = committed_steps(storage)
    if apply:
        doc = {
            "format": layout.ROOT_FORMAT,
            "version": layout.FORMAT_VERSION,
            "root_id": root_id,
            "created_at": time.time(),
            "restored_from": f"{len(steps)} committed step(s)",
        }
        damaged = storage.exists(layout.ROOT_MARKER)
        # a damaged marker is replaced whole; a missing one is claimed like a new root's
        storage.write(
            layout.ROOT_MARKER, json.dumps(doc).encode(), exclusive=not damaged, atomic=True
        )
    return root_id, len(steps)


def step_names(storage: Storage) -> dict[int, str]:
    """All step folders under the root (committed or not): step -> folder name."""
    out = {}
    for name in storage.listdir():
        step = layout.parse_step_dir(name)
        if step is not None:
            out[step] = name
    return out


def step_folders(storage: Storage) -> dict[int, list[Entry]]:
    """The files of every step folder (committed or not), from one listing of the root's step
    folders (on an object store one paged LIST, whatever junk folders the root holds)."""
    out: dict[int, list[Entry]] = {}
    for e in storage.walk(prefix=layout.STEP_PREFIX):
        step = layout.parse_step_dir(e.path.split("/", 1)[0])
        if step is not None and "/" in e.path:
            out.setdefault(step, []).append(e)
    return out


def has_commit(step: int, files: list[Entry]) -> bool:
    """Whether a step folder's files (step_folders) hold its commit marker."""
    return any(e.path == layout.commit_path(step) for e in files)


def committed_steps(storage: Storage) -> list[int]:
    """Steps whose commit marker exists, ascending. On an object store from one listing of
    the step folders (a HEAD per folder cost two requests per junk folder, issue 37); locally
    a stat per folder is cheaper than walking each."""
    if storage.protocol in OBJECT_STORES:
        return sorted(s for s, files in step_folders(storage).items() if has_commit(s, files))
    return sorted(s for s in step_names(storage) if storage.exists(layout.commit_path(s)))


MAX_TIME = 1e11  # epoch seconds (year 5138): a later commit time is corrupt or hostile


def commit_time(v, where: str) -> float:
    """A commit or creation time read from a file: a finite number in [0, MAX_TIME] (a string,
    boolean, list, infinity or huge number would crash the listing or the retention rules)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= MAX_TIME:
        raise ValueError(f"{where}: expected a time in epoch seconds, got {str(v)[:40]!r}")
    t = float(v)
    if math.isnan(t):
        raise ValueError(f"{where}: expected a time in epoch seconds, got NaN")
    return t


def parse_commit(blob: bytes, url: str) -> dict:
    """A commit marker's fields, each checked (CorruptCheckpoint naming the file otherwise):
    `save_id` (names the manifest), `manifest_xxh3` and the optional `committed_at` (a marker
    moved from another step is found by the manifest's own step number)."""
    doc = jsonfile.loads(blob, what=url)
    try:
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        if not (isinstance(doc.get("save_id"), str) and layout.SAVE_ID_RE.match(doc["save_id"])):
            raise ValueError("save_id")
        if not isinstance(doc.get("manifest_xxh3"), str) or len(doc["manifest_xxh3"]) > 64:
            raise ValueError("manifest_xxh3")
        version = doc.get("format_version")  # format 5: names a step index (rankmanifest)
        if version is not None and version not in layout.READ_VERSIONS:
            raise ValueError("format_version")
        if doc.get("committed_at") is not None:
            doc["committed_at"] = commit_time(doc["committed_at"], "committed_at")
    except ValueError as exc:
        raise CorruptCheckpoint(f"{url}: commit marker is malformed ({exc})", [url]) from None
    return doc


def read_commit(storage: Storage, step: int) -> dict:
    """The commit marker of a step (raises FileNotFoundError when it is not committed)."""
    rel = layout.commit_path(step)
    return parse_commit(storage.read(rel, limit=jsonfile.MAX_BYTES + 1), storage.url(rel))


def _committed(storage: Storage, step: int) -> dict:
    """The COMMIT of `step`, or NotCommitted naming the root's committed steps."""
    try:
        return read_commit(storage, step)
    except FileNotFoundError:
        raise NotCommitted(
            f"step {step} has no committed checkpoint under {storage.uri}; "
            f"committed steps: {committed_steps(storage) or 'none'}"
        ) from None


def read_manifest(
    storage: Storage, step: int, root_id: str | None = None, only: set[str] | None = None
) -> dict:
    """The validated manifest of a committed step (CorruptCheckpoint names the bad file);
    `only`: the FQNs a load reads, the only entries checked (manifest.validate)."""
    commit = _committed(storage, step)
    save_id, xxh3, slim = _named_manifest(storage, step, commit)
    rel = f"{layout.step_dir(step)}/{layout.manifest_name(save_id)}"
    url = storage.url(rel)
    namer = "slim" if slim else "commit"
    try:
        blob = storage.read(rel)  # (a 512 MiB limit would allocate 512 MiB up front)
    except FileNotFoundError:
        raise FileMissing(
            f"{url}: manifest named by the {namer} marker is missing", [url]
        ) from None
    if codec.digest(blob) != xxh3:
        raise CorruptCheckpoint(
            f"{url}: manifest checksum does not match the {namer} marker", [url]
        )
    try:
        doc = mf.load(blob)
        if rankmanifest.is_index(doc):  # format 5: every rank manifest, merged
            index = rankmanifest.validate_index(doc)
            _check_save(index, step, root_id or read_root_id(storage), url)
            return rankmanifest.read_merged(storage, step, index, url, only)
        m = mf.validate(doc, only)
    except mf.ManifestError as exc:
        raise CorruptCheckpoint(f"{url}: {exc}", [url]) from exc
    if slim and (m.get("slimmed") or {}).get("slim_id") != save_id:
        raise CorruptCheckpoint(f"{url}: not the slimmed manifest its marker names", [url])
    _check_save(m, step, root_id or read_root_id(storage), url)
    return m


def _check_save(m: dict, step: int, root_id: str | None, url: str) -> None:
    """A manifest (or step index) moved from another step or another root is refused."""
    if m["step"] != step:
        raise CorruptCheckpoint(f"{url}: manifest is for step {m['step']}, not {step}", [url])
    if m["root_id"] != root_id:
        raise CorruptCheckpoint(
            f"{url}: manifest belongs to another checkpoint root (a foreign run)", [url]
        )


def read_index(storage: Storage, step: int) -> tuple[dict, int] | None:
    """The checked step index of a committed format-5 step and its size; None when the step
    was saved with one manifest (or is slimmed: its slim manifest is one). CorruptCheckpoint,
    FileMissing or NotCommitted as read_manifest. A rank's load reads this, not the merge.
    The COMMIT of a format-5 save says so (`format_version`): a single manifest is not read."""
    commit = _committed(storage, step)
    if commit.get("format_version") != layout.RANKS_VERSION:
        return None  # one manifest (its COMMIT names no format): read_manifest reads it
    save_id, xxh3, slim = _named_manifest(storage, step, commit)
    if slim:
        return None  # a slimmed step's manifest is a single one
    rel = f"{layout.step_dir(step)}/{layout.manifest_name(save_id)}"
    url = storage.url(rel)
    try:
        blob = storage.read(rel, limit=rankmanifest.MAX_INDEX + 1)
    except FileNotFoundError:
        raise FileMissing(f"{url}: manifest named by the commit marker is missing", [url]) from None
    if codec.digest(blob) != xxh3:
        raise CorruptCheckpoint(f"{url}: manifest checksum does not match the marker", [url])
    index = rankmanifest.parse_index(blob, url)
    _check_save(index, step, read_root_id(storage), url)
    return index, len(blob)


def _named_manifest(storage: Storage, step: int, commit: dict) -> tuple[str, str, bool]:
    """(save id, checksum) of the manifest readers use, and whether a SLIM marker names it.
    A CORRUPT marker makes the step corrupt (ckptflow.core.marks); one folder listing."""
    names = set(storage.listdir(layout.step_dir(step)))
    reason = marks.corrupt_reason(storage, step, names)
    if reason is not None:
        url = storage.url(f"{layout.step_dir(step)}/{layout.CORRUPT}")
        raise CorruptCheckpoint(f"{url}: step {step} is marked corrupt ({reason})", [url])
    slim = marks.read_slim(storage, step, names)
    if slim is None:
        return commit["save_id"], commit["manifest_xxh3"], False
    if slim["of_save_id"] != commit["save_id"]:
        url = storage.url(f"{layout.step_dir(step)}/{layout.SLIM}")
        raise CorruptCheckpoint(f"{url}: slim marker of another save of step {step}", [url])
    return slim["save_id"], slim["manifest_xxh3"], True


def read_parent(storage: Storage) -> dict | None:
    """The root marker's `parent` ({"uri", "step", "root_id"}), or None (the usual case)."""
    try:
        doc = read_marker(storage)
    except CheckpointError:
        return None
    parent = doc.get("parent") if isinstance(doc, dict) else None
    if not (isinstance(parent, dict) and isinstance(parent.get("uri"), str)):
        return None
    return parent

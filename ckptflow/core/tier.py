"""The local tier's layout and its PIECE files (issue 35; torch-free, no hera).

    <local_dir>/<run_key>/rank-<r>/        a normal ckptflow checkpoint root (same format,
                                            checksums and commit rules as the durable root)
        ckptflow-root.json                  the gang's root marker (the same root id on every rank)
        objects/<k[:2]>/<k>                 content-addressed (k = xxh3-128 of the stored bytes)
        step-<S>/manifest-<id>.json         the gang's manifest of the local save of step S
        step-<S>/COMMIT                     as in the durable root
        step-<S>/PIECE-<r>.json             written LAST by whoever completes the piece

`run_key` names a run's folder: the first 16 hex of xxh3-64 of the durable root URI, so a
retried pod of the same run finds its pieces and another run's are never taken for its own.

A PIECE of saved rank r at step S lists every object rank r needs to load step S with the same
world size (the objects it wrote in the gang's save plus the shared items' objects):

    {"format": "ckptflow-piece", "version": 1, "rank": r, "world_size": W, "step": S,
     "manifest": "manifest-<id>.json", "objects": {key: stored_size, ...},
     "bytes": total, "at": unix_time}

A piece is complete iff its PIECE parses (bounded: 16 MiB, at most 1e6 objects, every field
validated), the root marker, manifest and COMMIT are there and agree (rootreader.read_manifest:
checksum of the manifest, root id, step), the manifest is the one the PIECE names, and every
listed object exists with its size and an xxh3-128 equal to its key. Incomplete or damaged
pieces are skipped, never loaded.

Contract (B peers, C restore, E drain build on it; signatures stay as they are):
- run_key(durable_uri) -> str
- piece_root(local_dir, run_key, rank) -> str            the URI of rank-<rank>
- piece_path(step, rank) -> str                          "step-<S>/PIECE-<r>.json"
- parse_piece(blob, what, root="") -> Piece              PieceError naming `what` on damage
- read_piece(storage, step, rank) -> Piece | None        None when absent; PieceError on damage
- verify_piece(storage, piece, *, check_hash=True) -> str | None   a problem (naming the file) or None
- list_pieces(local_dir, run_key) -> list[Piece]          every readable PIECE (not verified)
- link_problem(local_dir, run_key, rank) -> str | None   a link where the tier writes (refuse)
- new_piece(rank, world_size, step, manifest, objects) -> Piece   for writers (bytes, time filled)
- piece_files(piece) -> list[str]                         marker, manifest, COMMIT, objects, PIECE last
- write_piece(storage, piece) -> None                     written atomically: call it last
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass, field

import xxhash

from ckptflow.core import jsonfile, layout, rootreader
from ckptflow.core.errors import CheckpointError, CorruptCheckpoint
from ckptflow.core.storage import Storage

log = logging.getLogger("ckptflow.tier")

PIECE_FORMAT = "ckptflow-piece"
PIECE_VERSION = 1
MAX_PIECE_BYTES = 16 << 20  # ~300,000 objects; a larger PIECE is hostile (MAX_OBJECTS: 1e6)
MAX_OBJECTS = 1_000_000
MAX_RANK = 1 << 20  # more ranks than any gang: a larger rank or world size is hostile
MAX_OBJECT_BYTES = 1 << 44  # as manifest.MAX_BYTES: larger sizes are corrupt or hostile
HASH_BLOCK = 8 << 20  # objects are hashed this many bytes at a time (bounded memory)
RUN_KEY_RE = re.compile(r"^[0-9a-f]{16}$")
RANK_DIR_RE = re.compile(r"^rank-(\d{1,7})$")
PIECE_RE = re.compile(r"^PIECE-(\d{1,7})\.json$")
MANIFEST_RE = re.compile(r"^manifest-[0-9a-f]{8,32}\.json$")


class PieceError(CorruptCheckpoint):
    """A PIECE file is damaged, foreign or hostile (the message names the file)."""


@dataclass(frozen=True)
class Piece:
    """What saved rank `rank` needs to load `step` (from a PIECE file under `root`)."""

    rank: int
    world_size: int
    step: int
    manifest: str  # "manifest-<id>.json" in step-<S>/
    objects: dict[str, int] = field(repr=False)  # key -> stored size
    bytes: int
    at: float
    root: str = ""  # the URI of the rank root it was read from ("" when built in memory)

    def to_json(self) -> bytes:
        """The PIECE file's bytes."""
        doc = {
            "format": PIECE_FORMAT,
            "version": PIECE_VERSION,
            "rank": self.rank,
            "world_size": self.world_size,
            "step": self.step,
            "manifest": self.manifest,
            "objects": dict(sorted(self.objects.items())),
            "bytes": self.bytes,
            "at": self.at,
        }
        return json.dumps(doc, separators=(",", ":")).encode()


def new_piece(
    rank: int, world_size: int, step: int, manifest: str, objects: dict[str, int]
) -> Piece:
    """A Piece built by its writer (bytes summed, time now), validated like a read one."""
    doc = {
        "format": PIECE_FORMAT,
        "version": PIECE_VERSION,
        "rank": rank,
        "world_size": world_size,
        "step": step,
        "manifest": manifest,
        "objects": dict(objects),
        "bytes": sum(objects.values()),
        "at": time.time(),
    }
    return _validated(doc, "new piece", "")


def run_key(durable_uri: str) -> str:
    """The run's folder name under local_dir: 16 hex of xxh3-64 of the durable root URI
    (a trailing slash ignored, so `s3://b/run` and `s3://b/run/` are one run)."""
    if not isinstance(durable_uri, str) or not durable_uri:
        raise ValueError(f"run_key needs the durable root URI, got {durable_uri!r}")
    uri = durable_uri.rstrip("/") or durable_uri
    return xxhash.xxh3_64_hexdigest(uri.encode("utf-8", "surrogatepass"))[:16]


def _check_rank(rank, what: str = "rank") -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < MAX_RANK:
        raise ValueError(f"{what} must be an integer in [0, {MAX_RANK}), got {rank!r}")
    return rank


def piece_root(local_dir: str, run_key: str, rank: int) -> str:
    """The URI of saved rank `rank`'s root: <local_dir>/<run_key>/rank-<rank>. `run_key` must
    be one of run_key()'s (a name with `/` or `..` would place a root outside local_dir)."""
    if not isinstance(run_key, str) or not RUN_KEY_RE.match(run_key):
        raise ValueError(f"invalid run key {run_key!r} (16 hex digits, see tier.run_key)")
    if not isinstance(local_dir, str) or not local_dir.strip("/"):
        raise ValueError(f"local_dir must name a folder, got {local_dir!r}")
    return f"{local_dir.rstrip('/')}/{run_key}/rank-{_check_rank(rank)}"


def piece_path(step: int, rank: int) -> str:
    """The PIECE file of saved rank `rank` at `step`, relative to its root."""
    return f"{layout.step_dir(step)}/PIECE-{_check_rank(rank)}.json"


def _int(doc: dict, name: str, hi: int) -> int:
    v = doc.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi:
        raise ValueError(f"{name}: expected an integer in [0, {hi}], got {str(v)[:40]!r}")
    return v


def _objects(v) -> dict[str, int]:
    if not isinstance(v, dict):
        raise ValueError("objects: expected an object of key -> size")
    if len(v) > MAX_OBJECTS:
        raise ValueError(f"objects: {len(v)} entries (at most {MAX_OBJECTS})")
    for key, size in v.items():
        if not layout.KEY_RE.match(key):
            raise ValueError(f"objects: invalid object key {key[:40]!r}")
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_OBJECT_BYTES:
            raise ValueError(f"objects[{key}]: invalid size {str(size)[:40]!r}")
    return v


def _validated(doc, what: str, root: str) -> Piece:
    """Every field of a PIECE document checked; PieceError naming `what` otherwise."""
    try:
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        if doc.get("format") != PIECE_FORMAT:
            raise ValueError(f"format is not {PIECE_FORMAT!r}")
        if doc.get("version") != PIECE_VERSION:
            raise ValueError(f"unknown version {str(doc.get('version'))[:20]!r}")
        world = _int(doc, "world_size", MAX_RANK)
        rank = _int(doc, "rank", MAX_RANK)
        if world < 1 or rank >= world:
            raise ValueError(f"rank {rank} outside world size {world}")
        step = _int(doc, "step", layout.MAX_STEP)
        manifest = doc.get("manifest")
        if not isinstance(manifest, str) or not MANIFEST_RE.match(manifest):
            raise ValueError(f"manifest: invalid name {str(manifest)[:60]!r}")
        objects = _objects(doc.get("objects"))
        total = _int(doc, "bytes", MAX_OBJECT_BYTES * MAX_OBJECTS)
        if total != sum(objects.values()):
            raise ValueError(f"bytes {total} is not the sum of the objects' sizes")
        at = rootreader.commit_time(doc.get("at"), "at")
    except ValueError as exc:
        raise PieceError(f"{what}: PIECE file is malformed ({exc})", [what]) from None
    return Piece(rank, world, step, manifest, dict(objects), total, at, root)


def parse_piece(blob: bytes, what: str, root: str = "") -> Piece:
    """A PIECE file's bytes, bounded (16 MiB) and validated; PieceError naming `what`."""
    try:
        doc = jsonfile.loads(blob, what=what, max_bytes=MAX_PIECE_BYTES, max_depth=4)
    except CorruptCheckpoint as exc:
        raise PieceError(str(exc), [what]) from None
    return _validated(doc, what, root)


def read_piece(storage: Storage, step: int, rank: int) -> Piece | None:
    """The PIECE of saved rank `rank` at `step` in the rank root `storage`: None when there
    is none (never written, or a save still in progress); PieceError naming the file when it
    is damaged, or is another rank's or step's."""
    rel = piece_path(step, rank)
    url = storage.url(rel)
    try:
        blob = storage.read(rel, limit=MAX_PIECE_BYTES + 1)
    except FileNotFoundError:
        return None
    piece = parse_piece(blob, url, storage.uri)
    if (piece.rank, piece.step) != (rank, step):
        raise PieceError(
            f"{url}: PIECE is of rank {piece.rank} step {piece.step}, not rank {rank} step {step}",
            [url],
        )
    return piece


def _hash_problem(storage: Storage, rel: str, key: str, size: int) -> str | None:
    """The object at `rel` hashed in blocks (bounded memory): a problem or None."""
    h = xxhash.xxh3_128()
    seen = 0
    with storage.open(rel, "rb") as f:
        while block := f.read(HASH_BLOCK):
            seen += len(block)
            if seen > size:
                break
            h.update(block)
    if seen != size:
        return f"{storage.url(rel)}: {seen} bytes read, the PIECE says {size}"
    if h.hexdigest() != key:
        return f"{storage.url(rel)}: checksum does not match its key (damaged object)"
    return None


def verify_piece(storage: Storage, piece: Piece, *, check_hash: bool = True) -> str | None:
    """None when `piece` is complete in the rank root `storage`, else the first problem found,
    naming the file: marker, COMMIT and manifest (read and checked as a load reads them), the
    manifest the PIECE names, then every listed object's size and (with `check_hash`, the
    default) its xxh3-128. Storage errors are problems too: a piece that cannot be read is not
    complete."""
    try:
        if rootreader.read_marker(storage) is None:  # (reads would guess the root id)
            return f"{storage.url(layout.ROOT_MARKER)}: root marker of the piece is missing"
        m = rootreader.read_manifest(storage, piece.step)
        commit = rootreader.read_commit(storage, piece.step)
        if layout.manifest_name(commit["save_id"]) != piece.manifest:
            url = storage.url(piece_path(piece.step, piece.rank))
            return f"{url}: names {piece.manifest}, the step's COMMIT another manifest"
        if m.get("world_size", piece.world_size) != piece.world_size:
            url = storage.url(piece_path(piece.step, piece.rank))
            return f"{url}: world size {piece.world_size}, the manifest's {m['world_size']}"
        table = m["objects"]
        for key, size in sorted(piece.objects.items()):
            rel = layout.object_path(key)
            if table.get(key, {}).get("size") != size:  # a PIECE of another save, or crafted
                url = storage.url(piece_path(piece.step, piece.rank))
                return f"{url}: object {key} of {size} bytes is not in the step's manifest"
            try:
                found = storage.size(rel)
            except FileNotFoundError:
                return f"{storage.url(rel)}: object listed by the PIECE is missing"
            if found != size:
                return f"{storage.url(rel)}: {found} bytes, the PIECE says {size}"
            if check_hash and (problem := _hash_problem(storage, rel, key, size)):
                return problem
    except (CheckpointError, OSError, ValueError) as exc:
        return str(exc)
    return None


def link_problem(local_dir: str, run_key: str, rank: int | None = None) -> str | None:
    """Why the tier must not write, delete or read under <local_dir>/<run_key>/[rank-<rank>/]:
    that run folder or rank folder is a symbolic link or not a folder (None: absent or a plain
    folder). A link planted in a shared hostPath would take the tier's writes and its
    retention's deletes to another run's folder or a user's files (local_dir itself may be a
    link: a mount's). Only local disk has links: other storage is no problem."""
    run = piece_root(local_dir, run_key, rank or 0).rsplit("/", 1)[0]
    base = Storage(run)
    if base.protocol not in ("file", "local"):
        return None
    path = base.path()
    for folder in (path, *([] if rank is None else [os.path.join(path, f"rank-{rank}")])):
        if os.path.islink(folder):
            return (
                f"{folder} is a symbolic link (to {os.readlink(folder)}): the local tier "
                f"writes and deletes only in its own folders; remove the link"
            )
        if os.path.lexists(folder) and not os.path.isdir(folder):
            return f"{folder} is not a folder: the local tier cannot use it; remove it"
    return None


def list_pieces(local_dir: str, run_key: str, storage: Storage | None = None) -> list[Piece]:
    """Every readable PIECE under <local_dir>/<run_key>/ (all rank roots, all steps), sorted
    by (step, rank); not verified (verify_piece does that). A damaged PIECE is skipped with a
    warning naming it. `storage`: the local_dir's Storage when the caller has one (tests
    inject one); otherwise one is opened for local_dir."""
    piece_root(local_dir, run_key, 0)  # validates both (a bad key would leave local_dir)
    run = (storage or Storage(local_dir)).child(run_key)
    if problem := link_problem(run.url().rsplit("/", 1)[0], run_key):
        log.warning("no local pieces read: %s", problem)  # another run's are never ours
        return []
    found: list[Piece] = []
    for name in run.listdir():
        m = RANK_DIR_RE.match(name)
        if not m or int(m.group(1)) >= MAX_RANK:
            continue
        rank = int(m.group(1))
        if problem := link_problem(run.url().rsplit("/", 1)[0], run_key, rank):
            log.warning("skipping a local rank folder: %s", problem)
            continue
        root = run.child(name)
        for step in sorted(rootreader.step_names(root)):
            try:
                piece = read_piece(root, step, rank)
            except PieceError as exc:
                log.warning("skipping a damaged local piece: %s", exc)
                continue
            if piece is not None:
                found.append(piece)
    return sorted(found, key=lambda p: (p.step, p.rank))


def piece_files(piece: Piece) -> list[str]:
    """The files of a piece, relative to its root, in the order a copy writes them: the root
    marker, the manifest, COMMIT, the objects (sorted by key) and the PIECE last (a copy cut
    short has no PIECE, so it is never taken for complete)."""
    step = layout.step_dir(piece.step)
    return [
        layout.ROOT_MARKER,
        f"{step}/{piece.manifest}",
        f"{step}/{layout.COMMIT}",
        *[layout.object_path(k) for k in sorted(piece.objects)],
        piece_path(piece.step, piece.rank),
    ]


def write_piece(storage: Storage, piece: Piece) -> None:
    """Write the PIECE file (atomically: a reader sees none or all of it); the caller calls
    it last, once every other file of `piece_files` is durable in `storage`."""
    blob = piece.to_json()
    if len(blob) > MAX_PIECE_BYTES:
        raise CheckpointError(
            f"{storage.url(piece_path(piece.step, piece.rank))}: PIECE of "
            f"{len(piece.objects)} objects is over {MAX_PIECE_BYTES} bytes"
        )
    storage.write(piece_path(piece.step, piece.rank), blob, atomic=True)

"""Retention of a rank's own local steps (issue 35): what `LocalTier` keeps in its rank root.

After each complete local step the rank keeps its last `keep` complete steps, fewer when the
volume cannot hold them and the next save besides (`fit`: the budget over what one step
costs, the newest one's bytes times the copies the volume holds of each step: its own piece
and the replicas it keeps for peers; LocalTier keeps fit - 1). Never fewer than one: the
newest complete step is never deleted, whatever the budget says (when the volume cannot hold
one step while the next is written, the tier turns off instead: LocalTier). Older steps go,
complete or not, and then the objects no kept step's PIECE or manifest names. A step newer
than the newest complete one, or one in `busy` (a drain reading it), stays.

A step is deleted PIECE first, then COMMIT, then the rest: a half-deleted step never looks
complete to a restore. Local disk only (the tier's volume is).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil

from ckptflow.core import layout, rootreader, tier
from ckptflow.core.storage import Storage

log = logging.getLogger("ckptflow.tier")


def fit(budget_bytes: int, step_bytes: int, copies: int = 1) -> int:
    """How many local steps of `step_bytes` (times `copies`) a budget holds (0: not one)."""
    need = max(step_bytes, 1) * max(copies, 1)
    return max(budget_bytes, 0) // need


def used_bytes(root: str) -> int:
    """The bytes under a rank root (what its retention could free)."""
    total = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def budget(local_dir: str, root: str, size_mib: int) -> int:
    """The bytes this rank's steps may use: `size_mib` when set, else what its root holds
    plus the free space of `local_dir`'s filesystem."""
    if size_mib > 0:
        return size_mib << 20
    try:
        free = shutil.disk_usage(local_dir).free
    except OSError:
        return 0
    return free + used_bytes(root)


def complete_steps(storage: Storage, rank: int) -> dict[int, tier.Piece]:
    """The steps of this root whose PIECE of `rank` parses and whose files are there (sizes;
    the hashes were checked when the files came)."""
    out = {}
    for step in sorted(rootreader.step_names(storage)):
        try:
            piece = tier.read_piece(storage, step, rank)
        except tier.PieceError as exc:
            log.warning("local retention: %s", exc)
            continue
        if piece is not None and tier.verify_piece(storage, piece, check_hash=False) is None:
            out[step] = piece
    return out


def linked(storage: Storage) -> str | None:
    """The link on the way to this rank root (<local_dir>/<run_key>/rank-<r>: the root or
    its run folder), None when there is none: retention never deletes through a link planted
    there after the tier started (another run's folder, a user's files)."""
    root = storage.path()
    for folder in (root, os.path.dirname(root.rstrip("/"))):
        if os.path.islink(folder):
            return folder
    return None


def remove_step(storage: Storage, step: int, rank: int) -> None:
    """Delete a step folder: its PIECE and COMMIT first (never a half-deleted complete step)."""
    if where := linked(storage):
        log.warning("local retention: nothing deleted under %s: a symbolic link", where)
        return
    folder = storage.path(layout.step_dir(step))
    for name in (tier.piece_path(step, rank), layout.commit_path(step)):
        with contextlib.suppress(FileNotFoundError):
            os.remove(storage.path(name))
    shutil.rmtree(folder, ignore_errors=True)


def _named(storage: Storage, step: int, piece: tier.Piece | None) -> set[str]:
    """Every object a step left in place names: its PIECE's, and its manifest's when it has
    a readable one (a newer step whose piece is incomplete: the next save may reuse them)."""
    keys = set(piece.objects) if piece is not None else set()
    with contextlib.suppress(Exception):
        keys |= set(rootreader.read_manifest(storage, step, only=set())["objects"])
    return keys


def remove_unnamed_objects(storage: Storage, keep: set[str]) -> int:
    """Delete the object files of this root not in `keep`; the bytes freed."""
    freed = 0
    if linked(storage):
        return 0
    objects = storage.path(layout.OBJECTS)
    with contextlib.suppress(FileNotFoundError):
        for prefix in os.scandir(objects):
            if not prefix.is_dir(follow_symlinks=False):
                continue
            for entry in os.scandir(prefix.path):
                if entry.name in keep or not layout.KEY_RE.match(entry.name):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    freed += entry.stat(follow_symlinks=False).st_size
                    os.remove(entry.path)
    return freed


def sweep(storage: Storage, rank: int, complete: dict | None = None) -> int:
    """Delete the objects no step left in this root names; the bytes freed."""
    if complete is None:
        complete = complete_steps(storage, rank)
    names: set[str] = set()
    for step in sorted(rootreader.step_names(storage)):
        names |= _named(storage, step, complete.get(step))
    return remove_unnamed_objects(storage, names)


def retain(storage: Storage, rank: int, keep: int, busy: set[int] = frozenset()) -> list[int]:
    """Keep the last `keep` (>= 1) complete steps of this rank root; the steps deleted."""
    complete = complete_steps(storage, rank)
    if not complete:
        return []
    newest = max(complete)
    kept = set(sorted(complete)[-max(keep, 1) :]) | {s for s in busy if s in complete}
    steps = rootreader.step_names(storage)
    gone = sorted(s for s in steps if s < newest and s not in kept and s not in busy)
    for step in gone:
        remove_step(storage, step, rank)
    if gone:
        sweep(storage, rank, complete)
        log.info("local tier: deleted steps %s of %s, kept %s", gone, storage.uri, sorted(kept))
    return gone

"""Retention of the replicas a rank holds for its peers (issue 35).

A peer's replica folder <local_dir>/<run_key>/rank-<src>/ gets a new step whenever `src`
replicates. After each complete arrival the receiving rank keeps the last `keep` complete
replica steps of `src` (complete: its PIECE parses; the receiving server wrote it only after
checking every listed object, each hashed on arrival) and never the newest complete one is
deleted, whatever `keep` says. Older steps go, complete or not, and then the objects no kept
piece lists. A step newer than the newest complete one may be a push in progress: it stays,
and so do all objects while one exists (its PIECE, which names them, has not come yet).

Deletion order prevents a half-deleted step from looking complete: its PIECE first, then
COMMIT, then the rest of the folder.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil

from ckptflow.core import layout, tier
from ckptflow.core.storage import Storage

log = logging.getLogger("ckptflow.tier.peers")


def _complete_pieces(storage: Storage, src: int, steps: list[int]) -> dict[int, tier.Piece]:
    out = {}
    for step in steps:
        try:
            piece = tier.read_piece(storage, step, src)
        except tier.PieceError as exc:
            log.warning("replica retention: %s", exc)
            continue
        if piece is not None:
            out[step] = piece
    return out


def _remove_step(root: str, step: int, src: int) -> None:
    folder = os.path.join(root, layout.step_dir(step))
    for name in (f"PIECE-{src}.json", layout.COMMIT):  # what makes it complete goes first
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(folder, name))
    shutil.rmtree(folder, ignore_errors=True)


def _object_files(root: str):
    """(key, path) of every object file under root/objects (names that are not keys skipped)."""
    objects = os.path.join(root, layout.OBJECTS)
    with contextlib.suppress(FileNotFoundError):
        for prefix in os.scandir(objects):
            if not prefix.is_dir(follow_symlinks=False) or len(prefix.name) != 2:
                continue
            for entry in os.scandir(prefix.path):
                if layout.KEY_RE.match(entry.name) and entry.name[:2] == prefix.name:
                    yield entry.name, entry.path


def prune_replicas(root: str, src: int, keep: int) -> list[int]:
    """Delete all but the last `keep` (at least 1) complete replica steps of saved rank `src`
    from its local folder `root` (a local path), and the objects no kept piece lists; the
    deleted steps, ascending. Never called on a rank's own folder (its local saves have
    their own retention)."""
    storage = Storage(root)
    steps = sorted(layout_steps(storage))
    complete = _complete_pieces(storage, src, steps)
    if not complete:
        return []
    kept = sorted(complete)[-max(1, keep) :]
    newest = kept[-1]
    gone = [s for s in steps if s < newest and s not in kept]
    for step in gone:
        _remove_step(root, step, src)
    if any(s > newest for s in steps):
        return gone  # a push in progress: its objects are not listed anywhere yet
    needed = set()
    for step in kept:
        needed.update(complete[step].objects)
    for key, path in list(_object_files(root)):
        if key not in needed:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
    return gone


def layout_steps(storage: Storage) -> list[int]:
    """Every step folder of a rank root (committed or not)."""
    return [s for s in (layout.parse_step_dir(n) for n in storage.listdir()) if s is not None]

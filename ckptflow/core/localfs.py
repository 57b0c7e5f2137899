"""Local-disk writes of the storage module: whole files, atomic replacements and exclusive
creates (O_EXCL temporary file plus a hard link), each durable unless asked otherwise.

Split from ckptflow.core.storage, the one module callers use; this one reads no environment.
"""

from __future__ import annotations

import os
import re
import uuid

import ckptflow.core.localio as localio
from ckptflow.core.storage_errors import AlreadyExists

# Temporary files of atomic exclusive creates on local disk (see write).
_TMP_RE = re.compile(r"^\..+\.[0-9a-f]{12}\.tmp$")


def is_temporary(name: str) -> bool:
    """True for the hidden temporary file of an atomic write (left behind by a crash)."""
    return bool(_TMP_RE.match(name))


def write(path: str, data, exclusive: bool, durable: bool = True, atomic: bool = False) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if not (exclusive or atomic):
        _write_fd(path, data, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, durable)
        return
    # A reader must never see a half-written marker (an empty COMMIT reads as corrupt, an
    # empty ARCHIVED as damage, a torn PIN or eval.json loses what keeps a step): write a
    # hidden temporary file, then put it in place in one step. A crash in between leaves
    # only the hidden temporary file, which listdir does not show (GC removes it later).
    tmp = os.path.join(
        os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp"
    )
    _write_fd(tmp, data, os.O_WRONLY | os.O_CREAT | os.O_EXCL, durable)
    try:
        if exclusive:
            # A hard link creates the name atomically and only if it is free, so only one
            # writer wins.
            try:
                os.link(tmp, path)
            except FileExistsError as exc:  # the claim: only this error means another writer
                raise AlreadyExists(f"{path} already exists") from exc
        else:
            # A replacement that is meant (a new pin reason, a new evaluation): the name
            # points at the old file or the new one, never at a truncated one.
            os.replace(tmp, path)
            tmp = None
    finally:
        if tmp is not None:
            os.unlink(tmp)


def _write_fd(path: str, data, flags: int, durable: bool) -> None:
    fd = os.open(path, flags, 0o644)
    try:
        for chunk in data if isinstance(data, list) else [data]:
            view = memoryview(chunk).cast("B")
            while view:
                n = os.write(fd, view)
                view = view[n:]
        if durable:
            os.fsync(fd)
        else:
            localio.start_writeback(fd)  # the caller's sync() then finds it mostly written
    finally:
        os.close(fd)

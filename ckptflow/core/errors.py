"""Errors of the checkpoint engine; each message names the file and the fix."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint operation failed for a reason the user can act on."""


class CorruptCheckpoint(CheckpointError):
    """Stored data does not match its manifest (checksum, size, missing file, foreign run)."""

    def __init__(self, message: str, files: list[str] | None = None):
        super().__init__(message)
        self.files = files or []


class FileMissing(CorruptCheckpoint):
    """A file a committed step names is absent: damage while the step is still committed, a
    deletion (GC, retention, an archive move) when it no longer is (a load tells them apart)."""


class NotCommitted(CheckpointError):
    """The step has no commit marker: never committed, or deleted (GC deletes COMMIT first)."""


class StateDictMismatch(CheckpointError):
    """The state dict to load into does not match the checkpoint (keys, shapes, dtypes)."""


class SlimmedCheckpoint(StateDictMismatch):
    """The state dict asks for entries (optimizer state, RNG, data position) that a slimmed,
    weights-only step no longer holds (ckptflow.core.slim)."""

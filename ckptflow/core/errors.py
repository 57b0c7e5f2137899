"""Errors of the checkpoint engine; each message names the file and the fix."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint operation failed for a reason the user can act on."""


class CorruptCheckpoint(CheckpointError):
    """Stored data does not match its manifest (checksum, size, missing file, foreign run)."""

    def __init__(self, message: str, files: list[str] | None = None):
        super().__init__(message)
        self.files = files or []


class StateDictMismatch(CheckpointError):
    """The state dict to load into does not match the checkpoint (keys, shapes, dtypes)."""


class SlimmedCheckpoint(StateDictMismatch):
    """The state dict asks for entries (optimizer state, RNG, data position) that a slimmed,
    weights-only step no longer holds (ckptflow.core.slim)."""

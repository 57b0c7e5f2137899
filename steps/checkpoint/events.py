"""The Checkpointer's health events (ckptflow.core.health): one per save and per load, written
by rank 0 only, never failing the save or load they describe."""

from __future__ import annotations

from ckptflow.steps.checkpoint.results import LoadInfo, SaveStats

from ckptflow.core import health
from ckptflow.core.storage import Storage


def saved(storage: Storage, rank: int, stats: SaveStats, error: BaseException | None = None):
    """Record a save: committed (its stall, background time and bytes) or failed (why)."""
    if rank != 0:
        return
    health.record(
        storage,
        "save",
        step=stats.step,
        outcome="failed" if error is not None else "ok",
        duration_s=stats.background_s or stats.stall_s,
        stall_s=stats.stall_s,
        bytes=int(stats.bytes_written),
        save_kind=stats.kind if stats.kind in ("full", "delta") else "",
        error="" if error is None else f"{type(error).__name__}: {error}",
    )


def loaded(storage: Storage, rank: int, info: LoadInfo | None, error: BaseException | None = None):
    """Record a load: `resume` when the newest step was asked for (a restart resuming)."""
    if rank != 0:
        return
    health.record(
        storage,
        "load",
        step=None if info is None else info.step,
        outcome="failed" if error is not None else "ok",
        duration_s=0.0 if info is None else info.seconds,
        bytes=0 if info is None else int(info.bytes_read),
        resume=info is not None and info.requested is None,
        fell_back=0 if info is None else len(info.fell_back_from),
        error="" if error is None else f"{type(error).__name__}: {error}",
    )

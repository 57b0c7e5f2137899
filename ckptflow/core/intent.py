"""A save's intent (`saving-<save_id>.json`) and whether the save is still alive.

The coordinator writes the intent when a save starts and refreshes its modification time (a
heartbeat) until the save commits or fails. An intent touched within its lease is a live save:
GC leaves its folder alone and deletes no object written since it started, whatever the grace
period, so a GC with a short grace cannot free the objects of a save still being written.
Intents are untrusted files like any other: read bounded, every field checked.
"""

from __future__ import annotations

import json
import math
import time

from ckptflow.core import jsonfile, layout
from ckptflow.core.storage import Storage

MAX_INTENT = 64 << 10  # bytes: an intent is a hundred
MAX_LEASE_S = 86400.0  # a lease longer than a day is not believed
CLOCK_SKEW_S = 300.0  # writers' clocks vs the storage's: objects this much older stay too
STORAGE_TICK_S = 1.0  # S3 times have whole seconds: one tick of margin on the storage clock


def write_intent(storage: Storage, step: int, save_id: str, world_size: int) -> tuple[str, bytes]:
    """Write a save's intent (exclusively: atomic) and return its path and final bytes.

    `started_at` is the writer's clock; `started_mtime`, the intent's modification time by the
    storage's clock, is what GC compares object times with (no clock skew between the two):
    the intent is written once, its time read back, and written again with it."""
    rel = f"{layout.step_dir(step)}/{layout.saving_name(save_id)}"
    doc = {
        "save_id": save_id,
        "started_at": time.time(),
        "world_size": world_size,
        "lease_s": layout.SAVE_LEASE_S,
    }
    storage.write(rel, json.dumps(doc).encode(), exclusive=True)
    doc["started_mtime"] = storage.mtime(rel)
    blob = json.dumps(doc).encode()
    storage.write(rel, blob, atomic=True)
    return rel, blob


def end_intent(storage: Storage, rel: str, blob: bytes) -> None:
    """Mark a save's intent ended (the save failed and will not commit): GC then treats its
    folder as a leftover without waiting for the lease to run out."""
    doc = jsonfile.loads(blob, what=storage.url(rel), max_bytes=MAX_INTENT)  # our own bytes
    doc["ended_at"] = time.time()
    storage.write(rel, json.dumps(doc).encode(), atomic=True)


def _number(doc: dict, key: str, low: float, high: float) -> float | None:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    v = float(v)
    return v if math.isfinite(v) and low <= v <= high else None


def _read(storage: Storage, rel: str) -> dict:
    """The intent's fields, or {} when it is unreadable (torn, foreign, too large)."""
    try:
        doc = jsonfile.read(storage, rel, max_bytes=MAX_INTENT)
    except (FileNotFoundError, jsonfile.BadJsonFile):
        return {}
    return doc if isinstance(doc, dict) else {}


def live_starts(storage: Storage, step: int, now: float, files: list | None = None) -> list[float]:
    """When each live save in a step folder started (storage clock where it can tell, less
    CLOCK_SKEW_S); -inf for a live intent that cannot be read (then every object is kept).
    `files`: the folder's files when the caller listed them already."""
    out = []
    sd = layout.step_dir(step)
    for e in storage.walk(sd) if files is None else files:
        name = e.path.rsplit("/", 1)[-1]
        if not (name.startswith("saving-") and name.endswith(".json")):
            continue
        doc = _read(storage, e.path)
        lease = _number(doc, "lease_s", 0.0, MAX_LEASE_S) or layout.SAVE_LEASE_S
        if e.mtime < now - lease or "ended_at" in doc:
            continue  # no heartbeat within its lease, or it failed: a leftover
        out.append(_start(doc, e.mtime))
    return out


def _start(doc: dict, mtime: float) -> float:
    """The earliest time (storage clock) an object of this save can carry: its recorded
    storage-clock start, else its writer-clock start less CLOCK_SKEW_S, else -inf (keep all)."""
    started = _number(doc, "started_mtime", 0.0, math.inf)
    if started is not None:
        return min(started, mtime) - STORAGE_TICK_S
    started = _number(doc, "started_at", 0.0, math.inf)
    return -math.inf if started is None else min(started, mtime) - CLOCK_SKEW_S

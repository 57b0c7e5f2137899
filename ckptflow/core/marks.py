"""Step markers that change how readers see a committed step (docs/format.md "Slimmed steps"
and "Corrupt markers"); torch-free.

- `SLIM` (created exclusively, after the manifest it names): the step was demoted to weights
  only. `{"save_id", "manifest_xxh3", "of_save_id", "slimmed_at", "root_id"}`: readers load
  `manifest-<save_id>.json` (checksum-checked) instead of the one COMMIT names. A marker for
  another save of the step (`of_save_id`), torn or malformed, makes the step corrupt.
- `CORRUPT` (created exclusively): a verification drill or a deep verify found bad data. Its
  presence alone makes the step corrupt for every reader (loads fall back past it, retention
  does not count it as valid), whatever it holds: a damaged marker must not revive a bad step.
"""

from __future__ import annotations

import json
import time

from ckptflow.core import jsonfile, layout
from ckptflow.core.errors import CorruptCheckpoint
from ckptflow.core.storage import AlreadyExists, Storage

MAX_MARK = 64 << 10  # bytes of a SLIM or CORRUPT marker: a few hundred in practice
MAX_TIME = 1e11  # epoch seconds, as the manifest's
MAX_REASON = 2048


def _rel(step: int, name: str) -> str:
    return f"{layout.step_dir(step)}/{name}"


def corrupt_reason(storage: Storage, step: int, names: set[str]) -> str | None:
    """Why the step is marked corrupt (None: no CORRUPT marker among `names`)."""
    if layout.CORRUPT not in names:
        return None
    rel = _rel(step, layout.CORRUPT)
    try:
        doc = jsonfile.read(storage, rel, max_bytes=MAX_MARK)
    except FileNotFoundError:
        return None  # removed by hand meanwhile
    except jsonfile.BadJsonFile as exc:
        return f"marker unreadable ({exc.reason})"
    reason = doc.get("reason") if isinstance(doc, dict) else None
    return reason[:MAX_REASON] if isinstance(reason, str) and reason else "no reason recorded"


def mark_corrupt(storage: Storage, step: int, reason: str, by: str) -> bool:
    """Mark a step corrupt (exclusive create; True when this call wrote the marker)."""
    doc = {"reason": reason[:MAX_REASON], "by": by[:256], "marked_at": time.time()}
    try:
        storage.write(_rel(step, layout.CORRUPT), json.dumps(doc).encode(), exclusive=True)
    except AlreadyExists:
        return False
    return True


def _time(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= MAX_TIME


def read_slim(storage: Storage, step: int, names: set[str]) -> dict | None:
    """The SLIM marker's fields, each checked (None: the step is not slimmed); CorruptCheckpoint
    naming the marker when it is not one."""
    if layout.SLIM not in names:
        return None
    rel = _rel(step, layout.SLIM)
    url = storage.url(rel)
    try:
        doc = jsonfile.read(storage, rel, max_bytes=MAX_MARK)
    except FileNotFoundError:
        return None
    except jsonfile.BadJsonFile as exc:
        raise CorruptCheckpoint(f"{url}: slim marker is unreadable ({exc.reason})", [url]) from None
    ok = (
        isinstance(doc, dict)
        and all(
            isinstance(doc.get(k), str) and layout.SAVE_ID_RE.match(doc[k])
            for k in ("save_id", "of_save_id")
        )
        and isinstance(doc.get("manifest_xxh3"), str)
        and len(doc["manifest_xxh3"]) <= 64
        and _time(doc.get("slimmed_at"))
    )
    if not ok:
        raise CorruptCheckpoint(f"{url}: slim marker is malformed", [url])
    return doc


def write_slim(storage: Storage, step: int, doc: dict) -> bool:
    """Create the SLIM marker exclusively (True: this call won; False: a slim was there)."""
    try:
        storage.write(_rel(step, layout.SLIM), json.dumps(doc).encode(), exclusive=True)
    except AlreadyExists:
        return False
    return True

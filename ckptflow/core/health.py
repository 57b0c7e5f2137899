"""The checkpoint health event log: what every save, load, evaluation, verify, drill, gc and
slim did, one small JSON object per event under `<root>/events/` (torch-free).

    <root>/events/<16-digit epoch microseconds>-<kind>-<8 hex>.json

One file per event (object stores cannot append): the name sorts by time, the writer never
reads or rewrites another event, so concurrent writers never collide and a torn write damages
one event only. Recording never fails the operation it describes (a storage error is logged
and dropped) and never touches a step folder, so it cannot corrupt a checkpoint. Reading is
bounded (the newest MAX_EVENTS files, MAX_EVENT bytes each) and validates every field; a
damaged or foreign file is skipped and counted. `gc` keeps the newest MAX_EVENTS files.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
import uuid
from dataclasses import asdict, dataclass

from ckptflow.core import jsonfile
from ckptflow.core.storage import Storage

log = logging.getLogger("ckptflow.health")

EVENTS = "events"
MAX_EVENTS = 10_000  # read and kept: a year of hourly saves with their loads and evaluations
MAX_EVENT = 4096  # bytes of one event file
MAX_TEXT = 500
KINDS = ("save", "load", "evaluate", "verify", "drill", "gc", "slim", "recovery")
OUTCOMES = ("ok", "failed")
SAVE_KINDS = ("full", "delta", "")
RESTORE_SOURCES = ("local", "peer", "store")  # the local tier's restore order (issue 35)
_NAME = re.compile(r"^(\d{16})-([a-z]{2,16})-([0-9a-f]{8})\.json$")
_MAX_NUMBER = 1e15  # seconds or bytes beyond this are corrupt or hostile


@dataclass(frozen=True)
class Event:
    """One recorded operation (fields a kind does not use keep their defaults)."""

    kind: str  # one of KINDS
    at: float  # when it ended, epoch seconds
    outcome: str = "ok"  # "ok" or "failed"
    step: int | None = None  # the step it concerned
    duration_s: float = 0.0  # how long it took
    stall_s: float = 0.0  # save: how long training waited
    bytes: int = 0  # save: bytes written; load/verify: bytes read; gc/slim: bytes freed
    save_kind: str = ""  # save: "full" or "delta"
    resume: bool = False  # load: a restart resuming training (a recovery)
    fell_back: int = 0  # load: corrupt newer steps skipped
    error: str = ""  # failed: what went wrong (one line, cut)
    # recovery (ckptflow.core.liveness): the last step trained before the failure; its `step`
    # is the step resumed from, its `duration_s` last progress to the resumed first progress
    last_step: int | None = None
    # recovery (issue 35): where the restore loaded from (RESTORE_SOURCES; "" unrecorded) and
    # the bytes the gang's restore read from object storage (counted by Storage.meter)
    source: str = ""
    store_bytes: int = 0


def record(storage: Storage, kind: str, **fields) -> Event | None:
    """Write one event (never raises: health must not fail the work it describes)."""
    try:
        ev = Event(kind=kind, at=time.time(), **fields)
        ev = Event(**{**asdict(ev), "error": str(ev.error)[:MAX_TEXT]})
        check(asdict(ev))
        name = f"{int(ev.at * 1e6):016d}-{kind}-{uuid.uuid4().hex[:8]}.json"
        storage.write(f"{EVENTS}/{name}", json.dumps(asdict(ev)).encode(), durable=False)
        return ev
    except Exception as exc:  # (any storage or value error: the save itself went fine)
        log.warning("health event %s not recorded: %s: %s", kind, type(exc).__name__, exc)
        return None


def _number(v, lo: float = 0.0, hi: float = _MAX_NUMBER) -> bool:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    return math.isfinite(v) and lo <= v <= hi


def check(d) -> Event:
    """An Event from a parsed JSON object, every field checked (ValueError naming the field)."""
    if not isinstance(d, dict):
        raise ValueError("not a JSON object")
    if d.get("kind") not in KINDS:
        raise ValueError("kind")
    if d.get("outcome", "ok") not in OUTCOMES:
        raise ValueError("outcome")
    if not _number(d.get("at"), 0, 1e11):
        raise ValueError("at")
    for key in ("step", "last_step"):
        step = d.get(key)
        if step is not None and not (isinstance(step, int) and _number(step, 0, 1 << 62)):
            raise ValueError(key)
    for key in ("duration_s", "stall_s"):
        if not _number(d.get(key, 0.0)):
            raise ValueError(key)
    if d.get("source", "") not in ("", *RESTORE_SOURCES):
        raise ValueError("source")
    for key in ("bytes", "fell_back", "store_bytes"):
        v = d.get(key, 0)
        if not (isinstance(v, int) and _number(v)):
            raise ValueError(key)
    if d.get("save_kind", "") not in SAVE_KINDS or not isinstance(d.get("resume", False), bool):
        raise ValueError("save_kind/resume")
    if not isinstance(d.get("error", ""), str) or len(d.get("error", "")) > MAX_TEXT:
        raise ValueError("error")
    return Event(**{k: d[k] for k in Event.__dataclass_fields__ if k in d})


def event_names(storage: Storage) -> list[str]:
    """The event file names, oldest first (other names are ignored)."""
    return sorted(n for n in storage.listdir(EVENTS) if _NAME.match(n))


def read_events(storage: Storage, limit: int = MAX_EVENTS) -> tuple[list[Event], int]:
    """(the newest `limit` events, oldest first; how many files were damaged or foreign)."""
    events, damaged = [], 0
    for name in event_names(storage)[-limit:]:
        try:
            doc = jsonfile.read(storage, f"{EVENTS}/{name}", max_bytes=MAX_EVENT)
            ev = check(doc)
        except FileNotFoundError:
            continue  # pruned meanwhile
        except (jsonfile.BadJsonFile, ValueError, TypeError):
            damaged += 1
            continue
        if ev.kind != _NAME.match(name).group(2):
            damaged += 1
            continue
        events.append(ev)
    return events, damaged


def prune(storage: Storage, keep: int = MAX_EVENTS, apply: bool = True) -> list[str]:
    """Delete all but the newest `keep` event files (what `gc` does); the names."""
    doomed = event_names(storage)[:-keep] if keep else event_names(storage)
    if apply and doomed:
        storage.delete([f"{EVENTS}/{n}" for n in doomed])
    return doomed

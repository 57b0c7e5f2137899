"""Each recovery's measured time: the training's last sign of progress before a failure, and
the resumed training's first, as a `recovery` health event (issue 34; torch-free).

Rank 0 of a training rewrites one small object, `<ckpt root>/progress.json` ({"step", "at"}),
at most every PROGRESS_EVERY_S seconds, so a failure leaves behind when the training last
moved (within that interval). A training that starts in a root holding one is a recovery: once
its first step is done it records a `recovery` event whose `duration_s` runs from that last
progress to this first progress (detection, rescheduling, rendezvous, load and the first step:
what the gang lost in time), `last_step` the step it had reached and `step` the one it resumed
from (the work lost is the difference). `ckptflow ckpt stats` lists them.

The file is overwritten (one object, not a log: a year of progress would fill the event log),
read bounded and validated; a damaged one is ignored with a warning: the measurement is lost,
never the training.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

from ckptflow.core import health, jsonfile
from ckptflow.core.storage import Storage

log = logging.getLogger("ckptflow.liveness")

PROGRESS = "progress.json"
PROGRESS_EVERY_S = 5.0  # the measured recovery overstates the real one by at most this
MAX_PROGRESS = 512  # bytes of the progress file


@dataclass(frozen=True)
class Mark:
    """The training's progress at one moment."""

    step: int
    at: float  # epoch seconds


def read(storage: Storage) -> Mark | None:
    """The last progress recorded in this root; None when there is none (or it is damaged)."""
    try:
        doc = jsonfile.read(storage, PROGRESS, max_bytes=MAX_PROGRESS)
    except FileNotFoundError:
        return None
    except Exception as exc:  # damaged or unreachable: lose the measurement, not the training
        log.warning("%s unreadable, recovery time not measured: %s", PROGRESS, exc)
        return None
    step, at = (doc.get("step"), doc.get("at")) if isinstance(doc, dict) else (None, None)
    ok_step = isinstance(step, int) and not isinstance(step, bool) and 0 <= step < 1 << 62
    ok_at = isinstance(at, int | float) and not isinstance(at, bool) and 0 < at < 1e11
    if not (ok_step and ok_at):
        log.warning("%s damaged (step %r, at %r): recovery time not measured", PROGRESS, step, at)
        return None
    return Mark(step, float(at))


class Tracker:
    """Rank 0's progress marks and the one recovery record of a training (see the module doc)."""

    def __init__(
        self,
        storage: Storage,
        start_step: int,
        clock=time.time,
        *,
        source: str = "",
        store_bytes: int = 0,
    ):
        self.storage, self.start_step, self.clock = storage, start_step, clock
        # how the resume restored (issue 35): "local", "peer" or "store", and the gang's
        # bytes read from object storage; recorded with the recovery
        self.source, self.store_bytes = source, store_bytes
        self.before = read(storage)  # the failed training's last progress, if any
        self.written_at = 0.0

    def progressed(self, step: int) -> None:
        """Step `step` is done: record the recovery after the first one, and a throttled mark."""
        now = self.clock()
        if self.before is not None:
            before, self.before = self.before, None
            ev = health.record(
                self.storage,
                "recovery",
                step=self.start_step,
                last_step=before.step,
                duration_s=max(0.0, now - before.at),
                source=self.source,
                store_bytes=self.store_bytes,
            )
            if ev is not None:
                log.warning(
                    "recovered: %.1f s from the last progress (step %d) to the first step "
                    "after the restart (%d, from checkpoint %d%s)",
                    ev.duration_s, before.step, step, self.start_step,
                    f", {self.source}: {self.store_bytes} bytes from object storage"
                    if self.source else "",
                )  # fmt: skip
        if now - self.written_at >= PROGRESS_EVERY_S:
            self.written_at = now
            try:
                doc = json.dumps({"step": step, "at": now}).encode()
                self.storage.write(PROGRESS, doc, durable=False)
            except Exception as exc:  # a storage error must not fail the training step
                log.warning("%s not written: %s: %s", PROGRESS, type(exc).__name__, exc)

"""Retries of transient storage failures, with exponential backoff until a deadline.

An object store that is unreachable for a while (a network partition, a restarting endpoint,
throttling) must not fail a save or an evaluation that would pass a minute later: on a cluster
that costs a pod retry and the work since the last checkpoint. What counts as transient is
decided by the one error table (ckptflow.core.storage_errors.transient), never by message text.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger("ckptflow.storage")
T = TypeVar("T")

FIRST_DELAY_S = 0.5
MAX_DELAY_S = 8.0
_default_clock = time.monotonic
_default_sleep = time.sleep


def call(
    fn: Callable[[], T],
    *,
    deadline_s: float,
    transient: Callable[[BaseException], bool],
    what: str = "storage call",
    clock: Callable[[], float] | None = None,
    sleep: Callable[[float], None] | None = None,
) -> T:
    """`fn()`, retried while it raises a transient error, until `deadline_s` after the first
    failure; then the last error propagates (so the caller reports the real cause)."""
    clock = clock or _default_clock
    sleep = sleep or _default_sleep
    delay, deadline, attempt = FIRST_DELAY_S, None, 0
    while True:
        try:
            return fn()
        except Exception as exc:
            if not transient(exc):
                raise
            now = clock()
            deadline = now + deadline_s if deadline is None else deadline
            if now >= deadline:
                raise
            attempt += 1
            pause = min(delay, deadline - now)
            log.warning(
                "%s failed (%s); retry %d in %.1fs, giving up %.0fs after the first failure",
                what, type(exc).__name__, attempt, pause, deadline_s,
            )  # fmt: skip
            sleep(pause)
            delay = min(delay * 2, MAX_DELAY_S)

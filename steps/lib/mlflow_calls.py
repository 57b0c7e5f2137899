"""Calls to MLflow that never stop training.

Each call gets a few quick retries, then a warning, and the call is queued (or skipped, for
lookups) while MLflow is treated as down for `cooldown_s` (doubling with each consecutive
outage, up to 10 minutes); the queue is replayed at the next call after that, and at `flush()`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

# MLflow error codes that mean "this call is wrong", not "MLflow is down": such a call is
# dropped with a warning instead of being retried and queued (it would block the queue forever).
PERMANENT_ERRORS = {
    "INVALID_PARAMETER_VALUE",
    "RESOURCE_ALREADY_EXISTS",
    "RESOURCE_DOES_NOT_EXIST",
    "INVALID_STATE",
}


def _permanent(exc: BaseException) -> bool:
    return getattr(exc, "error_code", None) in PERMANENT_ERRORS


class MlflowCalls:
    """Runs MLflow calls with retries, a cooldown and a replay queue; never raises."""

    def __init__(
        self,
        enabled: bool,
        warn: Callable[[str], None],
        *,
        retries: int = 3,
        backoff_s: float = 0.5,
        cooldown_s: float = 30.0,
        max_queue: int = 10_000,
    ):
        self.enabled, self.warn = enabled, warn
        self.retries, self.backoff_s, self.cooldown_s = retries, backoff_s, cooldown_s
        self._queue: deque[tuple[str, Callable]] = deque(maxlen=max_queue)
        self._down_until = 0.0
        self._outages = 0  # consecutive failed attempts: the pause doubles with each

    def call(self, what: str, fn: Callable, *, queue: bool = True):
        """fn() with retries; on failure warn, queue it (when `queue`) and return None."""
        if not self.enabled:
            return None
        if time.monotonic() < self._down_until:
            if queue:
                self._queue.append((what, fn))
            return None
        if self._queue and not self._replay():
            if queue:
                self._queue.append((what, fn))
            return None
        return self._attempt(what, fn, queue)

    def _mark_down(self) -> None:
        """Pause MLflow calls: cooldown_s, doubling per consecutive outage up to 10 minutes, so a
        server that hangs (rather than refuses) costs training less and less time."""
        self._outages += 1
        pause = min(self.cooldown_s * 2 ** (self._outages - 1), max(self.cooldown_s, 600.0))
        self._down_until = time.monotonic() + pause

    def _attempt(self, what: str, fn: Callable, queue: bool):
        err: BaseException | None = None
        for i in range(self.retries):
            try:
                out = fn()
                self._outages = 0
                return out
            except Exception as exc:  # noqa: BLE001 - any MLflow failure must not stop training
                err = exc
                if _permanent(exc):
                    self.warn(f"MLflow rejected {what} (skipped): {str(exc)[:300]}")
                    return None
                if i + 1 < self.retries:
                    time.sleep(self.backoff_s * (2**i))
        self._mark_down()
        fate = "queued" if queue else "skipped"
        self.warn(f"MLflow unreachable ({what} {fate}): {type(err).__name__}: {str(err)[:300]}")
        if queue:
            self._queue.append((what, fn))
        return None

    def _replay(self) -> bool:
        """Send queued calls in order; False (and keep the rest) when MLflow is still down."""
        while self._queue:
            what, fn = self._queue[0]
            try:
                fn()
            except Exception as exc:  # noqa: BLE001
                if _permanent(exc):
                    self.warn(f"MLflow rejected queued {what} (dropped): {str(exc)[:300]}")
                    self._queue.popleft()
                    continue
                self._mark_down()
                self.warn(f"MLflow still unreachable ({len(self._queue)} queued): {exc!s:.200}")
                return False
            self._queue.popleft()
        self._outages = 0
        return True

    @property
    def pending(self) -> int:
        return len(self._queue)

    def flush(self) -> bool:
        """One last attempt to send what is queued; what still fails is dropped (warned)."""
        self._down_until = 0.0
        if self._queue and not self._replay():
            self.warn(f"MLflow: {len(self._queue)} call(s) could not be sent and were dropped")
            self._queue.clear()
            return False
        return True

"""Progress a person reads, for every long operation (training steps, verify, archive).

On a terminal: a tqdm bar with the rate and the time left, and while it is open every log line
is printed *above* it (tqdm's logging redirect), never glued onto it. Elsewhere (Argo and CI
logs, files): plain log lines, each with the count, the rate and the time left, every
`every_n` units or `every_s` seconds, and at the end; no carriage returns, no escape codes.
The plain line of a training step reads `step 300/1000 ...`, which `ckptflow run`'s live view
picks out of the step's log.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time


def human_size(n: float) -> str:
    """1536 -> '1.5 KiB' (binary units, as `ckpt ls` prints them)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover - the loop returns


def human_time(seconds: float) -> str:
    """75 -> '1:15', 3700 -> '1:01:40'."""
    s = max(0, int(round(seconds)))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """A count towards `total` (steps, or bytes with `nbytes`); see the module doc.

    `update_to(n)` sets the count (a training loop), `add(n)` adds to it from any thread (a
    verify pool). `close()` (or leaving the `with` block) ends the bar and the redirect.
    """

    def __init__(
        self,
        total: int,
        *,
        desc: str = "",
        unit: str = "step",
        nbytes: bool = False,
        initial: int = 0,
        enabled: bool = True,
        stream=None,
        every_n: int | None = None,
        every_s: float = 10.0,
        logger: logging.Logger | None = None,
    ):
        """`logger` gets the plain lines (a step's log); without one they are printed to
        `stream` (a command's stderr)."""
        self.total, self.desc, self.unit, self.nbytes = total, desc, unit, nbytes
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and bool(getattr(self.stream, "isatty", lambda: False)())
        self.every_n, self.every_s = every_n, every_s
        self.log = logger
        self._printed = False  # a plain line was printed: the end gets one too
        self.n, self._start_n = initial, initial
        self._t0 = self._last_line = time.monotonic()
        self._lock = threading.Lock()
        self._bar = None
        self._redirect: contextlib.AbstractContextManager | None = None
        if self.tty:
            self._open_bar(initial)

    def _open_bar(self, initial: int) -> None:
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        self._bar = tqdm(
            total=self.total or None,
            initial=initial,
            desc=self.desc or None,
            unit="B" if self.nbytes else self.unit,
            unit_scale=self.nbytes,
            unit_divisor=1024,
            file=self.stream,
            dynamic_ncols=True,
            mininterval=0.2,
        )
        self._redirect = logging_redirect_tqdm()
        self._redirect.__enter__()

    # -- counting ------------------------------------------------------------------------------
    def update_to(self, n: int, postfix: str = "") -> None:
        """The count is now `n` (with a short text of the latest values)."""
        with self._lock:
            self.n = n
        self._show(postfix)

    def add(self, n: int, total: int | None = None) -> None:
        """Add `n` (thread-safe); `total` replaces the total when given (known late)."""
        with self._lock:
            self.n += n
            if total is not None and total != self.total:
                self.total = total
                if self._bar is not None:
                    self._bar.total = total
        self._show("")

    def _show(self, postfix: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            with self._lock:
                self._bar.update(self.n - self._bar.n)
                if postfix:
                    self._bar.set_postfix_str(postfix, refresh=False)
            return
        now = time.monotonic()
        if self.every_n:
            due = self.n >= self.total or self.n % self.every_n == 0
        else:  # by time; the end only after a line (a quick operation stays quiet)
            due = now - self._last_line >= self.every_s or (self._printed and self.n >= self.total)
        if due:
            self._last_line, self._printed = now, True
            text = self.line(postfix, now)
            if self.log is not None:
                self.log.info("%s", text)
            else:
                print(text, file=self.stream, flush=True)

    def line(self, postfix: str = "", now: float | None = None) -> str:
        """`desc 300/1000 step postfix | 35.2 step/s, ETA 0:20` (sizes for bytes)."""
        now = time.monotonic() if now is None else now
        elapsed = max(now - self._t0, 1e-9)
        rate = (self.n - self._start_n) / elapsed
        if self.nbytes:
            count = f"{human_size(self.n)} / {human_size(self.total)}"
            speed = f"{human_size(rate)}/s"
        else:
            count = f"{self.unit} {self.n}/{self.total}"
            speed = f"{rate:.1f} {self.unit}/s"
        left = (self.total - self.n) / rate if rate > 0 and self.total else None
        eta = "done" if self.n >= self.total else f"ETA {human_time(left) if left else '?'}"
        head = f"{self.desc} {count}" if self.desc else count
        return f"{head} {postfix} | {speed}, {eta}" if postfix else f"{head} | {speed}, {eta}"

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""Durability of a save's local objects: each fdatasynced as soon as it is written, by a few
threads, then their folders; only this save's files (never a whole-host sync), so a save ends
when its last object is durable."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ckptflow.core import localio


class SharedClock:
    """Each interval's share of the time that overlapping intervals spent together: while n
    run at once, each is charged 1/n of the elapsed time (processor-sharing virtual time).

    Concurrent fdatasyncs wait on one device (a virtual disk's flush is often one flush of the
    whole backing file): charging each its full wait would count the device's time up to
    `THREADS` times over; charged its share, a save's syncs add up to the time the device
    spent on them."""

    def __init__(self, now: Callable[[], float] = time.perf_counter):
        self._now, self._lock = now, threading.Lock()
        self._running, self._virtual, self._last = 0, 0.0, now()

    def _advance(self) -> None:
        t = self._now()
        if self._running:
            self._virtual += (t - self._last) / self._running
        self._last = t

    def start(self) -> float:
        with self._lock:
            self._advance()
            self._running += 1
            return self._virtual

    def stop(self, started: float) -> float:
        """This interval's share, in seconds, since its start() returned `started`."""
        with self._lock:
            self._advance()
            self._running -= 1
            return self._virtual - started


class Durability:
    """Threads that fdatasync each local object as soon as it is written (its data went to the
    device with O_DIRECT, or the kernel is writing it back already), then the objects' folders;
    only this save's files.

    Several run at once: concurrent fsyncs share the filesystem's journal commits, and a
    checkpoint holds many small objects (biases, norms), each costing one; the writer threads
    go on writing meanwhile. Each object's share of the sync time goes to its `done` callback:
    part of what storing it cost (the adaptive codec's measure, adaptive.py)."""

    THREADS = 8

    def __init__(self, job):
        self.job = job
        self.pool = ThreadPoolExecutor(max_workers=self.THREADS, thread_name_prefix="ckpt-sync")
        self.futures: list = []
        self.paths: list[str] = []
        self.clock = SharedClock()

    def submit(self, rel: str, done: Callable[[float], None] | None = None) -> None:
        path = self.job.storage.path(rel)
        self.paths.append(path)
        self.futures.append(self.pool.submit(self._sync, path, done))

    def _sync(self, path: str, done) -> None:
        started = self.clock.start()
        try:
            localio.datasync(path)
        finally:
            share = self.clock.stop(started)
        if done is not None:
            done(share)

    def finish(self) -> None:
        """Wait until every submitted object, and the folders holding them, are durable."""
        for f in self.futures:
            f.result()
        # Each folder once (a fan-out folder's parent holds many of them), several at a time.
        for f in [self.pool.submit(localio.fsync_dir, d) for d in localio.dirs_of(self.paths)]:
            f.result()

    def close(self) -> None:
        self.pool.shutdown(wait=True)

"""Durability of a save's local objects: each fdatasynced as soon as it is written, by a few
threads, then their folders; only this save's files (never a whole-host sync), so a save ends
when its last object is durable. Also the root's storage-speed estimate (core.adaptive)."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ckptflow.core import localio


class Durability:
    """Threads that fdatasync each local object as soon as it is written (the kernel has
    started its writeback already), then the objects' folders; only this save's files.

    Several run at once: concurrent fsyncs share the filesystem's journal commits, and a
    checkpoint holds many small objects (biases, norms), each costing one. The time the disk
    is busy syncing, per byte, is the root's storage speed; with `workers` writer threads
    sharing the disk, each thread's share of it is `workers` times that."""

    THREADS = 8

    def __init__(self, job, workers: int):
        self.job, self.workers = job, workers
        self.pool = ThreadPoolExecutor(max_workers=self.THREADS, thread_name_prefix="ckpt-sync")
        self.futures: list = []
        self.paths: list[str] = []
        self._lock = threading.Lock()
        self._inflight, self._since, self._busy = 0, 0.0, 0.0

    def submit(self, rel: str, nbytes: int, write_s: float) -> None:
        path = self.job.storage.path(rel)
        self.paths.append(path)
        self.futures.append(self.pool.submit(self._sync, path, nbytes, write_s))

    def written_durably(self, rel: str) -> None:
        """A file already durable itself (O_DIRECT + fdatasync): only its folders to sync."""
        self.paths.append(self.job.storage.path(rel))

    def _sync(self, path: str, nbytes: int, write_s: float) -> None:
        with self._lock:
            if not self._inflight:
                self._since = time.perf_counter()
            self._inflight += 1
        try:
            localio.datasync(path)
        finally:
            with self._lock:
                now = time.perf_counter()
                busy = self._busy + now - self._since  # busy time since the last completion
                self._busy, self._since = 0.0, now
                self._inflight -= 1
        if self.job.policy is not None:
            self.job.policy.observe_store(nbytes, write_s + self.workers * busy)

    def finish(self) -> None:
        """Wait until every submitted object, and the folders holding them, are durable."""
        for f in self.futures:
            f.result()
        for f in [self.pool.submit(localio.sync_dirs, [d]) for d in self._dirs()]:
            f.result()

    def _dirs(self) -> list[str]:
        """One file path per folder to fsync (sync_dirs syncs its folder and that folder's)."""
        return list({os.path.dirname(p): p for p in self.paths}.values())

    def close(self) -> None:
        self.pool.shutdown(wait=True)

"""Durability of a save's local objects: each fdatasynced as soon as it is written, by a few
threads, then their folders; only this save's files (never a whole-host sync), so a save ends
when its last object is durable."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ckptflow.core import localio


class Durability:
    """Threads that fdatasync each local object as soon as it is written (its data went to the
    device with O_DIRECT, or the kernel is writing it back already), then the objects' folders;
    only this save's files.

    Several run at once: concurrent fsyncs share the filesystem's journal commits, and a
    checkpoint holds many small objects (biases, norms), each costing one; the writer threads
    go on writing meanwhile. Each object's `done` callback runs once its sync has ended (the
    adaptive codec's storage meter: adaptive.StorageMeter)."""

    THREADS = 8

    def __init__(self, job):
        self.job = job
        self.pool = ThreadPoolExecutor(max_workers=self.THREADS, thread_name_prefix="ckpt-sync")
        self.futures: list = []
        self.paths: list[str] = []

    def submit(self, rel: str, done: Callable[[], None] | None = None) -> None:
        path = self.job.storage.path(rel)
        self.paths.append(path)
        self.futures.append(self.pool.submit(self._sync, path, done))

    def _sync(self, path: str, done) -> None:
        try:
            localio.datasync(path)
        finally:  # a failed sync ends too: the meter must not count it in flight forever
            if done is not None:
                done()

    def finish(self) -> None:
        """Wait until every submitted object, and the folders holding them, are durable."""
        for f in self.futures:
            f.result()
        # Each folder once (a fan-out folder's parent holds many of them), several at a time.
        for f in [self.pool.submit(localio.fsync_dir, d) for d in localio.dirs_of(self.paths)]:
            f.result()

    def close(self) -> None:
        self.pool.shutdown(wait=True)

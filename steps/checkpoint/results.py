"""What the Checkpointer hands back: a save's stats and its handle (a save in flight), and what
the last load did. Plain data, no torch: split from checkpointer.py, which fills them in.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

GIB = float(1 << 30)


@dataclass
class SaveStats:
    """What one save cost this rank: the stall training saw and the background work."""

    step: int
    kind: str
    wait_s: float = 0.0  # waiting for the previous save still in flight
    stall_s: float = 0.0  # training blocked in save() (wait + snapshot, or the whole sync save)
    background_s: float = 0.0  # encode, hash, upload and commit
    bytes_raw: int = 0  # logical bytes this rank was responsible for
    bytes_written: int = 0  # new stored bytes this rank uploaded
    bytes_reused: int = 0  # raw bytes deduplicated against earlier checkpoints

    @property
    def gib_per_s(self) -> float:
        secs = self.background_s or self.stall_s
        return self.bytes_raw / GIB / secs if secs else 0.0

    def as_dict(self) -> dict:
        return {**self.__dict__, "gib_per_s": self.gib_per_s}


class SaveHandle:
    """A save in flight (or done). `wait()` returns its stats or raises its failure."""

    def __init__(self, stats: SaveStats, future: Future | None = None):
        self.stats = stats
        self._future = future

    def done(self) -> bool:
        return self._future is None or self._future.done()

    def wait(self) -> SaveStats:
        if self._future is not None:
            self._future.result()
        return self.stats


@dataclass
class LoadInfo:
    """What the last load did."""

    step: int
    requested: int | None
    fell_back_from: list = field(default_factory=list)  # [(step, reason), ...]
    bytes_read: int = 0
    bytes_received: int = 0
    seconds: float = 0.0
    chunks_held_peak: int = 0  # cooperative load: temporary chunk buffers held at once
    bytes_received_local: int = 0  # of bytes_received: copied from same-host ranks' memory

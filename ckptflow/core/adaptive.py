"""Whether compressing pays on a root: a cheap running estimate, per root, of what a writer
thread spends per raw byte of a part stored raw and of one stored compressed (the adaptive
codec, `compress="auto"`).

The cost of a part is measured end to end in the writer thread: byte grouping, compression,
hashing and the write until the bytes are on the device (local objects go with O_DIRECT, so
the write itself includes the disk's time; an upload includes the network's). That is what a
save waits for, with every hidden cost in it (the gather before compression, threads competing
for cores, a disk that is slow today), where a model from separate speeds (compressor bytes/s
against storage bytes/s) missed the gather and mis-chose on fast disks.

Each root keeps one estimate per mode, exponentially weighted by bytes, for the life of the
process, so a job's saves learn from each other. Until both modes have MIN_EVIDENCE bytes
measured, parts alternate between them (the one with less evidence goes next); after that the
cheaper mode is used, and one part in EXPLORE goes the other way, so the estimate of the mode
not in use follows the storage when it speeds up or slows down. Parts under MIN_PART are not
measured or decided (always compressed): what a small part costs is its file's creation and
sync, the same in both modes, and would drown the per-byte figures.
"""

from __future__ import annotations

import threading

MIN_PART = 1 << 20  # smaller parts are always compressed: their cost is their file's either way
MIN_EVIDENCE = 8 << 20  # raw bytes measured per mode before the estimates decide
HALF_BYTES = 256 << 20  # an observation of this many bytes moves an estimate halfway
EXPLORE = 16  # one decided part in this many takes the other mode (keeps its estimate fresh)


class Estimate:
    """A running estimate of seconds per byte, weighted by the bytes of each observation."""

    def __init__(self, s_per_byte: float | None = None, evidence: int = 0):
        self._lock = threading.Lock()
        self.s_per_byte, self.evidence = s_per_byte, evidence

    def add(self, nbytes: int, seconds: float) -> None:
        if nbytes <= 0 or seconds < 0:
            return
        x = seconds / nbytes
        w = nbytes / (nbytes + HALF_BYTES)
        with self._lock:
            old = self.s_per_byte
            self.s_per_byte = x if old is None else old + w * (x - old)
            self.evidence += nbytes

    def value(self, min_evidence: int = 0) -> float | None:
        with self._lock:
            return self.s_per_byte if self.evidence >= min_evidence else None


class Policy:
    """Chooses, part by part, between storing raw and compressed, from one root's estimates."""

    def __init__(self, raw: Estimate, packed: Estimate):
        self.raw, self.packed = raw, packed
        self._lock = threading.Lock()
        self._decided = 0

    def compress(self) -> bool:
        """Whether the next part is compressed (see the module docstring)."""
        r, c = self.raw.value(MIN_EVIDENCE), self.packed.value(MIN_EVIDENCE)
        if r is None or c is None:  # explore: the mode measured least goes next
            return self.packed.evidence <= self.raw.evidence
        with self._lock:
            self._decided += 1
            explore = self._decided % EXPLORE == 0
        return (c < r) != explore

    def observe(self, compressed: bool, raw_bytes: int, seconds: float) -> None:
        """A writer thread spent `seconds` encoding and storing a part of `raw_bytes`."""
        (self.packed if compressed else self.raw).add(raw_bytes, seconds)


_lock = threading.Lock()
_estimates: dict[tuple, tuple[Estimate, Estimate]] = {}


def policy_for(location: tuple, level: int) -> Policy:
    """The process-wide estimates of a root (`Storage.location()`) at a zstd level."""
    with _lock:
        raw, packed = _estimates.setdefault((tuple(location), level), (Estimate(), Estimate()))
    return Policy(raw, packed)

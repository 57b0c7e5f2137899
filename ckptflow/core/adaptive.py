"""Whether compressing pays on a root: a cheap running estimate, per root, of what a writer
thread spends per raw byte of a part stored raw and of one stored compressed (the adaptive
codec, `compress="auto"`).

The cost of a part is measured end to end: byte grouping, compression, hashing and the write
in the writer thread, plus the object's share of the time its sync took until the bytes are
durable (local objects go with O_DIRECT and are fdatasynced by other threads, PartCost; an
upload is durable when it returns and includes the network's time). That is what a save waits
for, with every hidden cost in it (the gather before compression, threads competing for cores,
a disk that is slow today, a virtual disk that takes writes into a cache and pays at the
flush), where a model from separate speeds (compressor bytes/s against storage bytes/s) missed
the gather and mis-chose on fast disks.

Each root keeps one estimate per mode, exponentially weighted by bytes, for the life of the
process, so a job's saves learn from each other. Storing raw is measured first (it costs the
least CPU to find out); compressing is measured on a SAMPLE of a part that was stored raw:
its first bytes are encoded (byte grouping, zstd, the hash) and thrown away, and the
compressed mode's cost per raw byte is that encoding time plus the measured raw cost of the
bytes it would still store (a part compressed whole only to measure it cost a fresh process's
first save ~20% of its bytes compressed on a disk where raw wins, +0.4 CPU-s per GiB). Until
both modes have MIN_EVIDENCE bytes measured, parts go raw and are sampled; after that the
cheaper mode is used, and one part in EXPLORE is measured the other way (sampled when raw
wins, stored raw when compressing wins; a compressed part is measured end to end), so the
estimate of the mode not in use follows the storage when it speeds up or slows down. Parts
under MIN_PART are not measured (what one costs is mostly fixed overhead, which would drown the
per-byte figures) but follow the mode the estimates favour (compressed until they are known):
packed into shared objects (packing.py), their bytes cost what a large part's bytes cost.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

# Smaller parts are not measured: they follow Policy.favoured(). (The same 1 MiB as
# packing.PACK_PART, for another reason: that is where a part is worth an object of its own.)
MIN_PART = 1 << 20
MIN_EVIDENCE = 8 << 20  # raw bytes measured per mode before the estimates decide
HALF_BYTES = 256 << 20  # an observation of this many bytes moves an estimate halfway
EXPLORE = 16  # one decided part in this many takes the other mode (keeps its estimate fresh)
SAMPLE = 1 << 20  # raw bytes of a part encoded to measure what compressing it would cost


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


class Decision(NamedTuple):
    """How the writer stores the next part: compressed or raw, and (raw) whether it also
    encodes a sample of it to measure the compressed mode."""

    compress: bool
    sample: bool = False


class Policy:
    """Chooses, part by part, between storing raw and compressed, from one root's estimates."""

    def __init__(self, raw: Estimate, packed: Estimate):
        self.raw, self.packed = raw, packed
        self._lock = threading.Lock()
        self._decided = 0

    def decide(self) -> Decision:
        """How the next part is stored (see the module docstring)."""
        r, c = self.raw.value(MIN_EVIDENCE), self.packed.value(MIN_EVIDENCE)
        if r is None or c is None:  # measure: raw first, compressing on a sample of it
            return Decision(False, sample=True)
        with self._lock:
            self._decided += 1
            explore = self._decided % EXPLORE == 0
        if c < r:
            return Decision(not explore)
        return Decision(False, sample=explore)

    def favoured(self) -> bool:
        """The mode the estimates favour now, without exploring (compressing until both are
        known): how parts too small to measure are stored."""
        r, c = self.raw.value(MIN_EVIDENCE), self.packed.value(MIN_EVIDENCE)
        return r is None or c is None or c < r

    def observe(self, compressed: bool, raw_bytes: int, seconds: float) -> None:
        """A writer thread spent `seconds` encoding and storing a part of `raw_bytes`."""
        (self.packed if compressed else self.raw).add(raw_bytes, seconds)

    def observe_sample(self, part_bytes: int, sample: int, seconds: float, stored: int) -> None:
        """Encoding the first `sample` raw bytes of a part of `part_bytes` (stored raw, its cost
        measured) took `seconds` and gave `stored` bytes: compressing that part would have cost
        the encoding plus the raw cost of the bytes left to store. Counted as evidence of the
        whole part (it stands for it)."""
        r = self.raw.value()
        if r is None or sample <= 0:
            return
        self.packed.add(part_bytes, part_bytes * (seconds / sample + r * stored / sample))


_lock = threading.Lock()
_estimates: dict[tuple, tuple[Estimate, Estimate]] = {}


def policy_for(location: tuple, level: int) -> Policy:
    """The process-wide estimates of a root (`Storage.location()`) at a zstd level."""
    with _lock:
        raw, packed = _estimates.setdefault((tuple(location), level), (Estimate(), Estimate()))
    return Policy(raw, packed)


class PartCost:
    """What storing one part cost, observed once both halves are in: the writer thread's time
    (with a sample's encoding, when one was taken) and the object's share of the time its
    sync took (a local object is made durable by another thread, after the write).

    Without the sync, a disk whose O_DIRECT writes land in a cache and whose flushes are slow
    (a virtual disk) looked nearly free to write raw: `auto` stored raw where compressing
    made the whole save 1.4x faster."""

    def __init__(self, policy: Policy, compressed: bool, raw_bytes: int):
        self.policy, self.compressed, self.raw_bytes = policy, compressed, raw_bytes
        self._lock = threading.Lock()
        self._thread: tuple | None = None
        self._sync: float | None = None

    def thread(self, seconds: float, sample: tuple[int, float, int] | None = None) -> None:
        """The writer thread spent `seconds` (a raw part: `sample` is (bytes encoded, their
        encoding seconds, bytes they encoded to), or None)."""
        with self._lock:
            self._thread = (seconds, sample)
            ready = self._sync is not None
        if ready:
            self._observe()

    def synced(self, share: float) -> None:
        """The object is durable; `share` seconds of sync time are this object's (0 where the
        write was durable by itself, as an upload is)."""
        with self._lock:
            self._sync = share
            ready = self._thread is not None
        if ready:
            self._observe()

    def _observe(self) -> None:
        seconds, sample = self._thread
        self.policy.observe(self.compressed, self.raw_bytes, seconds + self._sync)
        if sample is not None:  # after the raw cost it is measured against
            self.policy.observe_sample(self.raw_bytes, *sample)

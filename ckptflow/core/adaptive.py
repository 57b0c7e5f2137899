"""Whether compressing pays on a root: a cheap running estimate, per root, of what a part
costs per raw byte stored raw and stored compressed (the adaptive codec, `compress="auto"`),
priced as the pipeline a save is: writer threads spend CPU while the storage is busy with
other threads' bytes.

Each part's cost has two halves, measured apart:
- CPU: what the writer thread spent on the processor (`time.thread_time`: byte grouping,
  compression, hashing, the write's own CPU). The gather before compression is in it, and
  threads waiting for a core are not (a wall clock counted the queue for the cores as cost).
- device: the part's share of the time the storage was busy with it, its write's wait and
  the sync that makes it durable (local objects go with O_DIRECT and are fdatasynced by other
  threads; an upload is durable when it returns). Writes and syncs in flight at once split the
  time they spent together (DeviceClock), so n at once do not count the device's time n times.
  A virtual disk that takes O_DIRECT writes into a cache and pays at the flush is priced at
  its flush.

A save of N bytes with P cores for its writer threads then takes about
max(N * cpu / P, N * device): the storage works while threads encode. Compressing pays when
it shortens that, not when it costs one thread less (the serial price, encode + stored
fraction * raw, stored raw on a disk where whole saves compressed took 0.81-0.89 of the time).

Each root keeps one estimate per mode, exponentially weighted by bytes, for the life of the
process, so a job's saves learn from each other. Storing raw is measured first (it costs the
least CPU to find out); compressing is measured on a SAMPLE of a part that was stored raw:
its first bytes are encoded (byte grouping, zstd, the hash) and thrown away; the compressed
mode's CPU per raw byte is that encoding plus the raw write's CPU for the bytes it would still
store, and its device time the raw device time of those bytes (a part compressed whole only
to measure it cost a fresh process's first save ~20% of its bytes compressed on a disk where
raw wins, +0.4 CPU-s per GiB). Until both modes have MIN_EVIDENCE bytes measured, parts go
raw and are sampled; after that the cheaper mode is used, and one part in EXPLORE is measured
the other way (sampled when raw wins, stored raw when compressing wins; a compressed part is
measured end to end), so the estimate of the mode not in use follows the storage when it
speeds up or slows down. Parts under MIN_PART are not measured (what one costs is mostly
fixed overhead, which would drown the per-byte figures) but follow the mode the estimates
favour (compressed until they are known): packed into shared objects (packing.py), their
bytes cost what a large part's bytes cost.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

# Smaller parts are not measured: they follow Policy.favoured(). (The same 1 MiB as
# packing.PACK_PART, for another reason: that is where a part is worth an object of its own.)
MIN_PART = 1 << 20
MIN_EVIDENCE = 8 << 20  # raw bytes measured per mode before the estimates decide
HALF_BYTES = 256 << 20  # an observation of this many bytes moves an estimate halfway
EXPLORE = 16  # one decided part in this many takes the other mode (keeps its estimate fresh)
SAMPLE = 1 << 20  # raw bytes of a part encoded to measure what compressing it would cost


class Cost(NamedTuple):
    """Seconds per raw byte of a part: writer-thread CPU, and the storage's busy time."""

    cpu: float
    device: float

    def wall(self, cores: int) -> float:
        """Seconds per raw byte of a save whose writer threads have `cores` processors: the
        storage and the encoders work at once, the slower of the two sets the pace."""
        return max(self.cpu / max(cores, 1), self.device)


class Estimate:
    """A running estimate of a Cost, weighted by the bytes of each observation."""

    def __init__(self, cost: Cost | None = None, evidence: int = 0):
        self._lock = threading.Lock()
        self.cost, self.evidence = cost, evidence

    def add(self, nbytes: int, cpu: float, device: float) -> None:
        """An observation: `cpu` and `device` seconds spent on a part of `nbytes` raw bytes."""
        if nbytes <= 0 or cpu < 0 or device < 0:
            return
        x = Cost(cpu / nbytes, device / nbytes)
        w = nbytes / (nbytes + HALF_BYTES)
        with self._lock:
            old = self.cost
            if old is not None:
                x = Cost(old.cpu + w * (x.cpu - old.cpu), old.device + w * (x.device - old.device))
            self.cost = x
            self.evidence += nbytes

    def value(self, min_evidence: int = 0) -> Cost | None:
        with self._lock:
            return self.cost if self.evidence >= min_evidence else None


class Decision(NamedTuple):
    """How the writer stores the next part: compressed or raw, and (raw) whether it also
    encodes a sample of it to measure the compressed mode."""

    compress: bool
    sample: bool = False


def usable_cores() -> int:
    """The processors this process may run on (its affinity, where the platform says)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class Policy:
    """Chooses, part by part, between storing raw and compressed, from one root's estimates,
    for a save whose writer threads have `cores` processors (threads, at most the machine's)."""

    def __init__(self, raw: Estimate, packed: Estimate, cores: int = 1):
        self.raw, self.packed, self.cores = raw, packed, max(1, cores)
        self._lock = threading.Lock()
        self._decided = 0

    def _compressing_pays(self) -> bool | None:
        """True when compressing is the faster save, None until both modes are measured."""
        r, c = self.raw.value(MIN_EVIDENCE), self.packed.value(MIN_EVIDENCE)
        if r is None or c is None:
            return None
        return c.wall(self.cores) < r.wall(self.cores)

    def decide(self) -> Decision:
        """How the next part is stored (see the module docstring)."""
        pays = self._compressing_pays()
        if pays is None:  # measure: raw first, compressing on a sample of it
            return Decision(False, sample=True)
        with self._lock:
            self._decided += 1
            explore = self._decided % EXPLORE == 0
        if pays:
            return Decision(not explore)
        return Decision(False, sample=explore)

    def favoured(self) -> bool:
        """The mode the estimates favour now, without exploring (compressing until both are
        known): how parts too small to measure are stored."""
        return self._compressing_pays() is not False

    def observe(self, compressed: bool, raw_bytes: int, cpu: float, device: float) -> None:
        """Storing a part of `raw_bytes` cost `cpu` seconds of its writer thread and `device`
        seconds of the storage's time."""
        (self.packed if compressed else self.raw).add(raw_bytes, cpu, device)

    def observe_sample(self, part_bytes: int, sample: int, cpu: float, stored: int) -> None:
        """Encoding the first `sample` raw bytes of a part of `part_bytes` (stored raw, its cost
        measured) took `cpu` seconds and gave `stored` bytes: compressing that part would have
        cost the encoding plus the raw cost of the bytes left to store. Counted as evidence of
        the whole part (it stands for it)."""
        r = self.raw.value()
        if r is None or sample <= 0:
            return
        kept = part_bytes * stored / sample
        self.packed.add(part_bytes, part_bytes * cpu / sample + r.cpu * kept, r.device * kept)


_lock = threading.Lock()
_estimates: dict[tuple, tuple[Estimate, Estimate]] = {}


def policy_for(location: tuple, level: int, threads: int = 1) -> Policy:
    """The process-wide estimates of a root (`Storage.location()`) at a zstd level, for a save
    with `threads` writer threads."""
    with _lock:
        raw, packed = _estimates.setdefault((tuple(location), level), (Estimate(), Estimate()))
    return Policy(raw, packed, min(threads, usable_cores()))


class DeviceClock:
    """Each interval's share of the time that overlapping intervals spent together: while n
    run at once, each is charged 1/n of the elapsed time (processor-sharing virtual time).

    Writes and fdatasyncs in flight at once wait on one storage (a virtual disk's flush is
    often one flush of the whole backing file): charging each its full wait would count the
    storage's time as many times over as there were in flight; charged its share, a save's
    writes and syncs add up to the time the storage was busy with them."""

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


class PartCost:
    """What storing one part cost, observed once both halves are in: the writer thread's CPU
    and its write's share of the storage's time (with a sample's encoding, when one was
    taken), and the object's share of the time its sync took (a local object is made durable
    by another thread, after the write)."""

    def __init__(self, policy: Policy, compressed: bool, raw_bytes: int):
        self.policy, self.compressed, self.raw_bytes = policy, compressed, raw_bytes
        self._lock = threading.Lock()
        self._thread: tuple | None = None
        self._sync: float | None = None

    def thread(
        self, cpu: float, device: float, sample: tuple[int, float, int] | None = None
    ) -> None:
        """The writer thread spent `cpu` seconds, and its write `device` seconds of the
        storage's time (a raw part: `sample` is (bytes encoded, their encoding's CPU seconds,
        bytes they encoded to), or None)."""
        with self._lock:
            self._thread = (cpu, device, sample)
            ready = self._sync is not None
        if ready:
            self._observe()

    def synced(self, share: float) -> None:
        """The object is durable; `share` seconds of the storage's time were its sync's (0
        where the write was durable by itself, as an upload is)."""
        with self._lock:
            self._sync = share
            ready = self._thread is not None
        if ready:
            self._observe()

    def _observe(self) -> None:
        cpu, device, sample = self._thread
        self.policy.observe(self.compressed, self.raw_bytes, cpu, device + self._sync)
        if sample is not None:  # after the raw cost it is measured against
            self.policy.observe_sample(self.raw_bytes, *sample)

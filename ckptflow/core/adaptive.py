"""Whether compressing pays on a root: cheap running estimates, per root, of what storing a
part raw and compressed would cost the whole save (the adaptive codec, `compress="auto"`).

A save runs two resources at once: the writer threads' CPU (byte grouping, zstd, hashing)
and the storage (a disk, or the link to an object store), which serves every thread's writes.
So each is measured on its own:

- the storage's busy time per stored byte: the time during which at least one write of this
  root was in flight, from the write's start until the object is durable (a local object's
  fdatasync included: a virtual disk that takes O_DIRECT writes into a cache pays at the
  flush), over the bytes that became durable meanwhile (StorageMeter);
- the writer's CPU seconds per raw byte in each mode before its write (`time.thread_time()`;
  the write's own time, the CPU of its copies included, is the storage's), and the
  compressed stored/raw ratio.

A save of a raw byte then costs at least the largest of: the storage's time for the bytes the
mode stores, the CPU spread over the cores the writer threads may use, and, where a thread
encodes and then waits for its write (uploads to an object store), one thread's CPU plus its
own write spread over the writer threads; a local save writes behind the encoding
(steps/checkpoint/write_behind.py), so that last term does not apply to it. Priced per
thread as if each encoded and then wrote alone (the previous model), the encoding of one
thread was charged as if the device sat idle meanwhile; on a disk shared by two threads
`auto` stored raw where compressing made a 1 GiB save 1.2-1.3x faster.

Each root keeps its estimates, exponentially weighted by bytes, for the life of the process,
so a job's saves learn from each other. Storing raw is measured first (it costs the least CPU
to find out); compressing is measured on a SAMPLE of a part that was stored raw: its first
bytes are encoded (byte grouping, zstd, the hash) and thrown away (a part compressed whole
only to measure it cost a fresh process's first save ~20% of its bytes compressed on a disk
where raw wins, +0.4 CPU-s per GiB). Until every estimate has MIN_EVIDENCE bytes, parts go raw
and are sampled; after that the cheaper mode is used. When raw wins, one part in EXPLORE is
also sampled, so the compressed estimates stay fresh. When compressing wins, every part is
compressed: a compressed part measures the raw mode too (the writer's CPU but its coding: what
the same part stored raw would have cost the thread), and the storage is measured by every
write. (One part in EXPLORE stored raw to measure it stored ~6% of a save's bytes
uncompressed.) Parts under MIN_PART are not measured (what one costs is mostly fixed
overhead, which would drown the per-byte figures) but follow the mode the estimates favour
(compressed until they are known): packed into shared objects (packing.py), their bytes cost
what a large part's bytes cost.

Time is not the only cost: object storage (s3, gs, az) is billed by the byte stored, every
month a checkpoint is kept, so there `auto` always compresses (`auto_rule`), even where the
store outruns the encoder (a local S3 server stored 0.957 of the raw bytes under the time-only
rule: the 19-38 % compression saves, paid for). Only a local disk or memory, where the bytes
cost nothing more, is left to the time estimates. Manifests record the rule (`mode`).
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from ckptflow.core import codec
from ckptflow.core.uris import OBJECT_STORES

# Smaller parts are not measured: they follow Policy.favoured(). (The same 1 MiB as
# packing.PACK_PART, for another reason: that is where a part is worth an object of its own.)
MIN_PART = 1 << 20
MIN_EVIDENCE = 8 << 20  # raw bytes behind each estimate before the estimates decide
HALF_BYTES = 256 << 20  # an observation of this many bytes moves an estimate halfway
EXPLORE = 16  # one decided part in this many takes the other mode (keeps its estimate fresh)
# Raw bytes of a part encoded to measure what compressing it would cost (1 MiB measured
# 1.15 CPU-s per GiB, 4 MiB and more 0.91-0.96: the fixed cost of each call weighed on less).
SAMPLE = 4 << 20
CGROUP = "/sys/fs/cgroup"  # where a container sees its own cgroup (its CPU quota)
BILLED_BY_BYTE = frozenset(OBJECT_STORES)  # stores whose stored bytes cost money (by location)


def auto_rule(protocol: str) -> str:
    """What `compress="auto"` does on a store: "always" where stored bytes are billed (object
    storage: what compression saves is money every month, whatever the time), "adaptive"
    elsewhere (local disk, memory: whichever mode saves faster, by the estimates)."""
    return "always" if protocol in BILLED_BY_BYTE else "adaptive"


def mode(compress: bool | str, policy: Policy | None) -> str:
    """The compression mode a manifest records: "on", "off", or "auto:<rule>"."""
    if compress != "auto":
        return "on" if compress else "off"
    return "auto:always" if policy is None or policy.always else "auto:adaptive"


class Estimate:
    """A running estimate of a quantity per byte (seconds, or stored bytes), weighted by the
    bytes of each observation."""

    def __init__(self, per_byte: float | None = None, evidence: int = 0):
        self._lock = threading.Lock()
        self.per_byte, self.evidence = per_byte, evidence

    def add(self, nbytes: int, amount: float) -> None:
        if nbytes <= 0 or amount < 0:
            return
        x = amount / nbytes
        w = nbytes / (nbytes + HALF_BYTES)
        with self._lock:
            old = self.per_byte
            self.per_byte = x if old is None else old + w * (x - old)
            self.evidence += nbytes

    def value(self, min_evidence: int = 0) -> float | None:
        with self._lock:
            return self.per_byte if self.evidence >= min_evidence else None


class StorageMeter:
    """The storage's busy time per stored byte: time with at least one write of the root in
    flight (start of the write to the object durable), over the bytes made durable meanwhile.
    Overlapping writes are counted once, so two threads sharing one disk measure the disk,
    not twice its time."""

    def __init__(self, now: Callable[[], float] = time.perf_counter):
        self.estimate = Estimate()
        self._now, self._lock = now, threading.Lock()
        self._inflight, self._busy, self._last = 0, 0.0, now()

    def _advance(self) -> None:
        t = self._now()
        if self._inflight:
            self._busy += t - self._last
        self._last = t

    def begin(self) -> None:
        """A write starts."""
        with self._lock:
            self._advance()
            self._inflight += 1

    def end(self, nbytes: int) -> None:
        """A write that began is durable with `nbytes` stored (0: it failed; its time goes to
        the next write's bytes)."""
        with self._lock:
            self._advance()
            self._inflight -= 1
            if nbytes <= 0:
                return
            busy, self._busy = self._busy, 0.0
        self.estimate.add(nbytes, busy)


class Costs:
    """One root's estimates (process-wide, shared by its saves)."""

    def __init__(self):
        self.storage = StorageMeter()
        self.cpu_raw = Estimate()  # writer CPU seconds per raw byte, stored raw
        self.cpu_packed = Estimate()  # writer CPU seconds per raw byte, compressed
        self.ratio = Estimate()  # stored bytes per raw byte, compressed


class Decision(NamedTuple):
    """How the writer stores the next part: compressed or raw, and (raw) whether it also
    encodes a sample of it to measure the compressed mode."""

    compress: bool
    sample: bool = False


def usable_cores(cgroup: str = CGROUP) -> int:
    """The cores this process may use: its affinity mask, capped by its cgroup's CPU quota.
    A pod limited to 4 CPUs on a 128-core node sees 128 in its mask: priced over those, its
    encoding looked 32x cheaper than it runs."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this platform
        n = os.cpu_count() or 1
    quota = cpu_quota(cgroup)
    if quota is not None:
        n = min(n, math.ceil(quota))
    return max(1, n)


@functools.cache
def process_cores() -> int:
    """usable_cores() of this process, read once: a save's policy is made on the path an async
    save stalls training on, and the cgroup files are a filesystem read each time."""
    return usable_cores()


def cpu_quota(cgroup: str = CGROUP) -> float | None:
    """The CPUs a cgroup's quota grants (v2 `cpu.max`, or v1 `cpu.cfs_quota_us` over
    `cpu.cfs_period_us`), or None where there is no quota or it cannot be read."""
    try:
        quota, period = _small_read(f"{cgroup}/cpu.max").split()[:2]
    except (OSError, ValueError):
        try:
            quota = _small_read(f"{cgroup}/cpu/cpu.cfs_quota_us").strip()
            period = _small_read(f"{cgroup}/cpu/cpu.cfs_period_us").strip()
        except (OSError, ValueError):
            return None
    try:
        q, p = int(quota), int(period)
    except ValueError:  # "max": no quota
        return None
    return q / p if q > 0 and p > 0 else None  # v1 says -1 for none


def _small_read(path: str) -> str:
    with open(path) as f:
        return f.read(256)  # a line of two numbers; a larger file is not one


def save_seconds(
    cpu: float, ratio: float, storage: float, workers: int, cores: int, overlapped: bool = False
) -> float:
    """Seconds a save spends per raw byte at least: the storage's time for the bytes stored,
    the CPU over the cores the writers may use, or (unless each writer's writes go behind its
    encoding: `overlapped`) each writer's CPU and own write in turn."""
    stored = ratio * storage
    floor = max(stored, cpu / max(1, min(workers, cores)))
    return floor if overlapped else max(floor, (cpu + stored) / max(1, workers))


class Policy:
    """Chooses, part by part, between storing raw and compressed, from one root's estimates,
    for a save with `workers` writer threads (`overlapped`: whose writes go behind their
    encoding, steps/checkpoint/write_behind.py)."""

    def __init__(
        self,
        costs: Costs,
        workers: int = 1,
        cores: int | None = None,
        overlapped: bool = False,
        always: bool = False,
    ):
        self.costs, self.workers, self.overlapped = costs, workers, overlapped
        self.always = always  # billed by the byte (auto_rule): every part compressed
        self.cores = process_cores() if cores is None else cores
        self._lock = threading.Lock()
        self._decided = 0

    @property
    def meter(self) -> StorageMeter:
        return self.costs.storage

    def seconds(self) -> tuple[float, float] | None:
        """(raw, compressed) seconds per raw byte of the save, or None until all is measured."""
        c = self.costs
        known = [
            e.value(MIN_EVIDENCE) for e in (c.storage.estimate, c.cpu_raw, c.cpu_packed, c.ratio)
        ]
        if None in known:
            return None
        storage, cpu_raw, cpu_packed, ratio = known
        w, n, o = self.workers, self.cores, self.overlapped
        return (
            save_seconds(cpu_raw, 1.0, storage, w, n, o),
            save_seconds(cpu_packed, ratio, storage, w, n, o),
        )

    def decide(self) -> Decision:
        """How the next part is stored (see the module docstring)."""
        if self.always:
            return Decision(True)
        costs = self.seconds()
        if costs is None:  # measure: raw first, compressing on a sample of it
            return Decision(False, sample=True)
        with self._lock:
            self._decided += 1
            explore = self._decided % EXPLORE == 0
        raw, packed = costs
        if packed < raw:
            return Decision(True)
        return Decision(False, sample=explore)

    def favoured(self) -> bool:
        """The mode the estimates favour now, without exploring (compressing until all are
        known): how parts too small to measure are stored."""
        if self.always:
            return True
        costs = self.seconds()
        return costs is None or costs[1] < costs[0]

    def observe(
        self,
        compressed: bool,
        raw_bytes: int,
        cpu: float,
        stored: int,
        raw_cpu: float | None = None,
    ) -> None:
        """A writer thread spent `cpu` CPU seconds encoding a part of `raw_bytes` into `stored`
        bytes (and hashing it) before writing them. A compressed part also says, as `raw_cpu`,
        what storing it raw would have cost the thread (its CPU but the compressing and the
        hashing of the stored bytes)."""
        if compressed:
            self.costs.cpu_packed.add(raw_bytes, cpu)
            self.costs.ratio.add(raw_bytes, stored)
            if raw_cpu is not None:
                self.costs.cpu_raw.add(raw_bytes, raw_cpu)
        else:
            self.costs.cpu_raw.add(raw_bytes, cpu)

    def observe_sample(self, part_bytes: int, sample: int, cpu: float, stored: int) -> None:
        """Encoding the first `sample` raw bytes of a part of `part_bytes` (stored raw, its CPU
        observed) took `cpu` CPU seconds and gave `stored` bytes: compressing the part would
        have cost that encoding on top of what storing it raw cost the thread. Counted as
        evidence of the whole part (it stands for it)."""
        raw_cpu = self.costs.cpu_raw.value()
        if raw_cpu is None or sample <= 0:
            return
        self.costs.cpu_packed.add(part_bytes, part_bytes * (cpu / sample + raw_cpu))
        self.costs.ratio.add(part_bytes, part_bytes * stored / sample)


_thread = threading.local()  # per writer thread: whether its encoder is warm (sample_cost)


def sample_cost(raw, width: int, level: int) -> tuple[int, float, int]:
    """What compressing a part stored raw would have cost, measured on its first bytes
    (encoded and thrown away): (bytes, CPU seconds, bytes they encoded to)."""
    n = min(len(raw), SAMPLE)
    n -= n % max(width, 1)
    if not getattr(_thread, "warm", False):
        # A thread's first encoding creates its zstd context and faults in its buffers
        # (5.5 CPU-s per GiB on a 1 MiB sample, against 1.1 after): that measured one-off
        # set-up, not what compressing costs, and tipped `auto` to raw on a slow disk.
        codec.encode(raw[:n], width, level, True).digest()
        _thread.warm = True
    t0 = time.thread_time()
    enc = codec.encode(raw[:n], width, level, True)
    enc.digest()  # a compressed object is hashed too (its name)
    return n, time.thread_time() - t0, enc.nbytes


_lock = threading.Lock()
_costs: dict[tuple, Costs] = {}


def policy_for(location: tuple, level: int, workers: int = 1) -> Policy:
    """A policy over the process-wide estimates of a root (`Storage.location()`, whose first
    element is its protocol) at a zstd level, for a save with `workers` writer threads; on a
    store billed by the byte it always compresses (auto_rule)."""
    with _lock:
        costs = _costs.setdefault((tuple(location), level), Costs())
    always = bool(location) and auto_rule(location[0]) == "always"
    return Policy(costs, workers, always=always)

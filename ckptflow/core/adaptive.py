"""When compressing a byte plane pays: a cheap running estimate of each root's storage speed
against this process's compression speed (the adaptive codec, `compress="auto"`).

A writer thread spends `s` seconds storing each byte (its upload, or its share of the disk's
writeback until durable) and `c` seconds compressing each input byte. Compressing a plane to a
fraction `r` of its size saves `(1 - r) * s` per byte and costs `c`: it pays when
`c < (1 - r) * s`. Slow storage (S3 over a network, a busy disk) makes `s` large and every
compressible plane worth it; storage faster than the encoder makes storing raw cheaper.

Estimates are exponentially weighted by bytes, kept per root (S3 and local disk differ) for the
life of the process, so a job's saves learn from each other. Until a root has MIN_EVIDENCE
bytes measured, planes that compress are compressed (today's behaviour: a tiny save is never
decided by the latency of a few small files).
"""

from __future__ import annotations

import threading

MIN_EVIDENCE = 32 << 20  # bytes stored before a root's estimate decides anything
HALF_BYTES = 256 << 20  # an observation of this many bytes moves an estimate halfway
PRIOR_COMPRESS_S = 1e-9  # seconds per byte of zstd on a float plane before any is measured


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
    """Decides per plane, from one root's storage estimate and the compression estimate."""

    def __init__(self, store: Estimate, compress: Estimate):
        self.store, self.compress = store, compress

    def pays(self, ratio: float) -> bool:
        """Whether compressing a plane to `ratio` of its size is faster than storing it raw."""
        s = self.store.value(MIN_EVIDENCE)
        if s is None:
            return True
        c = self.compress.value()
        return (PRIOR_COMPRESS_S if c is None else c) < (1.0 - ratio) * s

    def observe_compress(self, nbytes: int, seconds: float) -> None:
        self.compress.add(nbytes, seconds)

    def observe_store(self, nbytes: int, seconds: float) -> None:
        """A writer thread spent `seconds` storing `nbytes` (until durable)."""
        self.store.add(nbytes, seconds)


_lock = threading.Lock()
_stores: dict[tuple, Estimate] = {}
_compress: dict[int, Estimate] = {}


def policy_for(location: tuple, level: int) -> Policy:
    """The process-wide policy of a root (`Storage.location()`) at a zstd level."""
    with _lock:
        store = _stores.setdefault(tuple(location), Estimate())
        comp = _compress.setdefault(level, Estimate())
    return Policy(store, comp)

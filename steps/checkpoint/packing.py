"""Small parts of a save packed into shared objects (format version 4).

A checkpoint holds hundreds of small tensors per rank (biases, norm gains, step counters): one
object each costs a file created and synced (or a PUT) per part, which on a fast disk took as
long as writing all the large tensors (321 small of 396 tensors, 14 MiB of 256: 0.35 s of a
0.63 s write, one shared object instead: 0.29 s). So parts under PACK_PART bytes (`pack_kib`) are encoded as
ever, then appended to the save's current pack of their group (top-level name); a pack is stored as one content-addressed
object when it reaches PACK_BYTES, and at the end of the save. Each packed part's record names
the pack, its size, and the part's `[start, length]` span of it; readers verify the whole pack
(its checksum, before any decoding) and cut the span out. Deduplication, GC, verify and archive
work on objects as before: a pack is an object that many parts reference.
"""

from __future__ import annotations

import threading

import numpy as np

from ckptflow.core import codec

# Parts smaller than this are packed (Checkpointer(pack_kib=...)); the same 1 MiB as
# core.adaptive.MIN_PART, for another reason: that is where a part is too small to measure.
PACK_PART = 1 << 20
PACK_BYTES = 4 << 20  # a pack is stored once it holds this much (at most MAX_PACK, manifest.py)


def group_of(item_key: str) -> str:
    """The pack a part of this manifest item goes to: one per top-level name (`model`,
    `optim`, ...), so dropping a whole group (slimming to weights only) frees its packs
    instead of pinning them through parts of another group. (In an item key the first `@`
    starts the offsets: the FQN's own are escaped.)"""
    return item_key.split("@", 1)[0].split(".", 1)[0]


class _Pack:
    def __init__(self):
        self.buf = bytearray()
        self.recs: list[tuple[dict, int, int]] = []


class Packer:
    """Collects encoded small parts and stores them as packs through `store(key, encoded)`."""

    def __init__(self, store):
        self._store = store
        self._lock = threading.Lock()
        self._packs: dict[str, _Pack] = {}

    def add(self, group: str, enc: codec.Encoded, rec: dict) -> None:
        """Append a part's stored bytes to its group's pack (copied now: raw planes may view a
        reused buffer); `rec` gets its object, size and span when its pack is stored."""
        with self._lock:
            pack = self._packs.setdefault(group, _Pack())
            start = len(pack.buf)
            for c in enc.chunks:
                pack.buf += memoryview(c).cast("B")
            pack.recs.append((rec, start, enc.nbytes))
            full = self._packs.pop(group) if len(pack.buf) >= PACK_BYTES else None
        if full is not None:
            self._flush(full.buf, full.recs)

    def finish(self) -> None:
        """Store the last, partly filled packs."""
        with self._lock:
            packs, self._packs = list(self._packs.values()), {}
        for pack in packs:
            self._flush(pack.buf, pack.recs)

    def _flush(self, buf: bytearray, recs: list) -> None:
        """Store a pack no longer appended to; a view of its buffer, not a copy of it (a save's
        small parts, ~14 MiB here, were copied once more for nothing)."""
        if not recs:
            return
        blob = np.frombuffer(buf, dtype=np.uint8)
        key = codec.digest(blob)
        self._store(key, codec.Encoded([blob], [["raw", len(blob)]]))
        for rec, start, length in recs:
            rec.update(object=key, stored_size=len(blob), span=[start, length])

"""The cooperative load's plan (coop.py): from what every rank announced, which rank reads
each shared part from storage (its owner), and in which order the parts are exchanged.

Pure and torch-free (split from coop.py, which runs the exchange): every rank computes the same
plan from the same gathered announcements, so no further collective is needed to agree on it.
"""

from __future__ import annotations

from collections import deque


def assign_owners(needs: list[list[str]], sizes: dict[str, int]) -> dict[str, int]:
    """Owner rank of each chunk: its only needer, or the least-loaded of its needers."""
    needers: dict[str, list[int]] = {}
    for rank, keys in enumerate(needs):
        for k in keys:
            needers.setdefault(k, []).append(rank)
    load = [0] * len(needs)
    owners = {}
    # Largest first gives a better balance; ties broken by key for a deterministic result.
    for k in sorted(needers, key=lambda k: (-sizes[k], k)):
        owner = min(needers[k], key=lambda r: (load[r], r))
        owners[k] = owner
        load[owner] += sizes[k]
    return owners


def largest_first(units: list, sizes: dict) -> list:
    """Parts copied by memory, in the order their owners decode them: largest first, so what
    is left to copy once an owner's last decode is done is a small part (sorted by key, the
    last could be the largest: its whole copy after everything else). The same on every
    rank (the sizes are what all announced)."""
    return sorted(units, key=lambda u: (-sizes[u], u))


def interleave(units: list, owners: dict) -> list:
    """Units in an order that alternates owners (each owner's in its own order), so every
    owner's reads are needed early and run while the others' parts are broadcast."""
    per: dict[int, deque] = {}
    for u in units:
        per.setdefault(owners[u], deque()).append(u)
    out, queues = [], [per[r] for r in sorted(per)]
    while queues:
        out += [q.popleft() for q in queues]
        queues = [q for q in queues if q]
    return out


class Plan:
    """What every rank announced, as every rank sees it: each part's size, owner, needers,
    whether its destinations are on GPU, and where each rank's destination bytes are.

    The parts of one pack (small parts sharing an object, packing.py) have one owner: owned
    part by part, every rank would read every pack whole."""

    def __init__(self, world: int, announced: list):
        self.sizes, self.gpu, self.any_gpu, self.ptrs = {}, {}, {}, {}
        self.needers: dict = {}
        self.agreed: dict = {}  # part -> every needer announced the same size
        self.pack: dict = {}  # part -> the pack object holding it (packed parts)
        needs: list = [[] for _ in range(world)]
        for rank, chunks in enumerate(announced):
            for k, (part_sizes, on_gpu, ptr, *packs) in chunks.items():
                pos = 0
                for i, n in enumerate(part_sizes):
                    u = (k, i)
                    if packs and i < len(packs[0]) and packs[0][i]:
                        self.pack[u] = packs[0][i]
                    self.agreed[u] = self.agreed.get(u, True) and self.sizes.get(u, n) == n
                    self.sizes[u] = n
                    self.gpu[u] = self.gpu.get(u, True) and on_gpu
                    self.any_gpu[u] = self.any_gpu.get(u, False) or on_gpu
                    self.needers.setdefault(u, []).append(rank)
                    needs[rank].append(u)
                    if ptr:
                        self.ptrs[(rank, u)] = ptr + pos
                    pos += n
        self.owners = self._owners(needs)
        self.count = {u: len(r) for u, r in self.needers.items()}

    def _owners(self, needs: list) -> dict:
        """assign_owners over bundles: the parts of a pack that the same ranks need together
        (its owner must need every part it reads), every other part alone."""
        # (a bundle is keyed like a part, (str, int), so bundles sort with parts; no part has
        # index -1)
        bundle = {
            u: (f"\0pack:{self.pack[u]}:{self.needers[u]}", -1) if u in self.pack else u
            for u in self.sizes
        }
        sizes: dict = {}
        for u, b in bundle.items():
            sizes[b] = sizes.get(b, 0) + self.sizes[u]
        wanted = [sorted({bundle[u] for u in units}) for units in needs]
        owner_of = assign_owners(wanted, sizes)
        return {u: owner_of[b] for u, b in bundle.items()}

    def by_memory(self, u, reach: list[list[bool]]) -> bool:
        """Whether a shared part is copied out of its owner's memory: the owner decodes it into
        its own host destination, and every needer (on the host) can read that memory."""
        o = self.owners[u]
        return (
            (o, u) in self.ptrs
            and self.agreed[u]
            and self.sizes[u] > 0
            and not self.any_gpu[u]
            and all(reach[r][o] for r in self.needers[u])
        )

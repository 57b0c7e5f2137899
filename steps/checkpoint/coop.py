"""Cooperative load: each stored chunk that several ranks need is read from storage once.

Every rank announces the chunks it needs; each chunk needed by more than one rank gets one
owner (balancing bytes across ranks); owners read, verify and decode their chunks, then the
raw bytes are broadcast over the process group. With M ranks loading a replicated model, each
rank reads about 1/M of the checkpoint from storage.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.distributed as dist

from ckptflow.core import manifest as mf
from ckptflow.core.errors import CorruptCheckpoint


def _key(rec: dict) -> str:
    return mf.item_key(rec["fqn"], rec["offset"])


def _raw_size(rec: dict) -> int:
    return sum(p["raw_size"] for p in rec["parts"])


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


class Exchange:
    """The `exchange` hook of CkptStorageReader for a process group of `world` ranks."""

    def __init__(self, group, rank: int, world: int, threads: int = 4):
        self.group, self.rank, self.world, self.threads = group, rank, world, threads

    def __call__(self, records: dict, read_item, stats) -> dict:
        mine = {_key(rec): idx for idx, rec in records.items()}
        needs: list = [None] * self.world
        dist.all_gather_object(needs, sorted(mine), group=self.group)
        by_key = {_key(rec): rec for rec in records.values()}
        sizes = dict.fromkeys({k for ks in needs for k in ks}, 0)
        sizes.update({k: _raw_size(r) for k, r in by_key.items()})
        sizes_all: list = [None] * self.world
        dist.all_gather_object(sizes_all, {k: sizes[k] for k in mine}, group=self.group)
        for s in sizes_all:
            sizes.update(s)
        owners = assign_owners(needs, sizes)
        raws, error = self._read_owned(owners, by_key, read_item)
        self._agree_or_raise(error)
        shared = sorted(k for k in owners if sum(k in n for n in needs) > 1)
        for k in shared:
            buf = raws.get(k)
            if buf is None:
                buf = np.empty(sizes[k], dtype=np.uint8)
            t = torch.from_numpy(buf)
            dist.broadcast(t, group_src=owners[k], group=self.group)
            if owners[k] != self.rank and k in mine:
                raws[k] = buf
                stats.bytes_received += sizes[k]
        return {mine[k]: raws[k] for k in mine}

    def _read_owned(self, owners: dict, by_key: dict, read_item):
        todo = [k for k, o in owners.items() if o == self.rank]
        try:
            with ThreadPoolExecutor(
                max_workers=self.threads, thread_name_prefix="ckpt-coop"
            ) as pool:
                return dict(
                    zip(todo, pool.map(lambda k: read_item(by_key[k]), todo), strict=True)
                ), None
        except Exception as exc:  # reported to every rank below, so no rank waits forever
            return {}, exc

    def _agree_or_raise(self, error: Exception | None) -> None:
        errors: list = [None] * self.world
        dist.all_gather_object(errors, None if error is None else str(error), group=self.group)
        if error is not None:
            raise error
        bad = [(r, e) for r, e in enumerate(errors) if e]
        if bad:
            raise CorruptCheckpoint(f"rank {bad[0][0]} could not read its share: {bad[0][1]}")

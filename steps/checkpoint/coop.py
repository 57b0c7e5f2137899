"""Cooperative load: each stored part that several ranks need is read from storage once.

Every rank announces the chunks it needs; each part (at most `part_bytes`, 64 MiB by default)
of a chunk needed by more than one rank gets one owner (balancing bytes across ranks). Owners
read, verify and decode their parts in the Checkpointer's threads, straight into the
destination tensor where a chunk fills one exactly, while the main thread broadcasts the parts
already decoded, in one order every rank agrees on: reads overlap the exchange, and receivers
get the bytes straight into their destination. A chunk that must be resharded (it fills only
part of a tensor, or needs a dtype cast) goes through a temporary buffer, scattered and freed
as soon as its last part is in; at most `threads` parts are decoded ahead of the broadcast,
so at most a few temporary buffers are held at once (never every decoded chunk until the end).
With M ranks loading a replicated model, each rank reads about 1/M of the checkpoint.

Tensors on GPU whose every needer fills them directly are exchanged over the training's own
process group (NCCL) when one is given; everything else goes over the Checkpointer's gloo group.

This module runs the exchange (announce, agree, read, broadcast); who owns which part and the
order parts go in is planned in coop_plan.py, parts copied between ranks of one host in
coop_local.py.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.distributed as dist
from ckptflow.steps.checkpoint import coop_local
from ckptflow.steps.checkpoint.coop_plan import Plan as _Plan
from ckptflow.steps.checkpoint.coop_plan import (  # noqa: F401  (assign_owners: re-exported)
    assign_owners,
    interleave,
    largest_first,
)

from ckptflow.core import manifest as mf
from ckptflow.core.errors import CorruptCheckpoint


def _key(rec: dict) -> str:
    return mf.item_key(rec["fqn"], rec["offset"])


class _Dests:
    """Where each needed chunk's bytes go: its destination tensor's own bytes (direct), or a
    temporary buffer scattered into the destinations when its last part is in. Counts the
    temporary buffers held at once (ReadStats.chunks_held_peak)."""

    def __init__(self, records: dict, items: dict, direct, scatter, stats, gpu_ok: bool):
        self.records, self.items, self._scatter, self.stats = records, items, scatter, stats
        self.by_key = {_key(rec): idx for idx, rec in records.items()}
        self.direct = {}  # idx -> (uint8 view of the destination, commit)
        for idx, rec in records.items():
            found = direct(rec, items[idx])
            # A GPU destination is filled directly only over a GPU-capable group (NCCL).
            if found is not None and (gpu_ok or not found[0].is_cuda):
                self.direct[idx] = found
        self._temp: dict = {}
        self._left = {idx: len(rec["parts"]) for idx, rec in records.items()}
        self._lock = threading.Lock()
        self._held = 0

    def host_ptr(self, key: str) -> int:
        """Address of the chunk's host destination bytes when it is filled directly, else 0."""
        found = self.direct.get(self.by_key[key])
        return 0 if found is None or found[0].is_cuda else found[0].data_ptr()

    def is_direct(self, key: str) -> bool:
        """Whether the chunk is filled straight in its destination (no temporary buffer)."""
        return self.by_key[key] in self.direct

    def on_gpu(self, key: str) -> bool:
        found = self.direct.get(self.by_key[key])
        return found is not None and found[0].is_cuda

    def view(self, key: str) -> torch.Tensor:
        """The chunk's bytes as a flat uint8 tensor (created on first use when temporary)."""
        idx = self.by_key[key]
        if idx in self.direct:
            return self.direct[idx][0]
        with self._lock:
            buf = self._temp.get(idx)
            if buf is None:
                size = sum(p["raw_size"] for p in self.records[idx]["parts"])
                buf = self._temp[idx] = torch.empty(size, dtype=torch.uint8)
                self._held += 1
                self.stats.chunks_held_peak = max(self.stats.chunks_held_peak, self._held)
        return buf

    def part_done(self, key: str) -> None:
        """One more part of the chunk is in place: scatter and free the chunk after its last."""
        idx = self.by_key[key]
        with self._lock:
            self._left[idx] -= 1
            if self._left[idx]:
                return
            buf = self._temp.pop(idx, None)
        if idx in self.direct:
            self.direct[idx][1]()
            return
        self._scatter(self.records[idx], buf.numpy(), self.items[idx])
        with self._lock:
            self._held -= 1


def any_rank(flag: bool, group) -> bool:
    """Whether `flag` is set on any rank of `group` (one small all-reduce; every rank gets the
    same answer, so all take the same branch)."""
    t = torch.tensor([int(flag)], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return bool(t.item())


def nccl_group(world_size: int):
    """The training's NCCL group when it spans the same ranks as ours: a cooperative load
    exchanges GPU tensors over it (untested without GPUs); None on CPU-only runs."""
    try:
        if dist.get_backend() != "nccl" or dist.get_world_size() != world_size:
            return None
    except (RuntimeError, ValueError):
        return None
    return dist.group.WORLD


class Exchange:
    """The `exchange` hook of CkptStorageReader for a process group of `world` ranks.

    `local`: parts whose owner and needers share a host are copied out of the owner's memory
    (coop_local.py) instead of broadcast over the group; False broadcasts everything."""

    def __init__(
        self,
        group,
        rank: int,
        world: int,
        threads: int = 4,
        device_group=None,
        local=True,
        items: list[dict] | None = None,
    ):
        self.group, self.rank, self.world, self.threads = group, rank, world, threads
        self.device_group = device_group  # the training's NCCL group, for GPU destinations
        self.local = local
        self.bytes_local = 0  # of the last load: bytes copied from same-host peers' memory
        # Every stored chunk of the step (the manifest's item records, in its order: the same
        # on every rank): with it, ranks first count who needs what in one all-reduce and
        # announce only the chunks another rank needs too (None: every chunk announced).
        # Records are told apart by identity: a load validates only the items it reads.
        self.index = None if items is None else {id(rec): i for i, rec in enumerate(items)}

    def __call__(self, records: dict, items: dict, read_part, direct, scatter, stats) -> None:
        """Fill every needed chunk: read the parts this rank owns, exchange the shared ones.

        `read_part(part, out)` decodes a part into a uint8 array; `direct(rec, items)` gives
        the uint8 view of the destination a chunk fills exactly (and its commit), or None;
        `scatter(rec, raw, items)` copies a whole chunk's bytes into its destinations."""
        dests = _Dests(records, items, direct, scatter, stats, self.device_group is not None)
        by_key = {_key(rec): rec for rec in records.values()}
        shared_keys, any_shared = self._shared(by_key)
        # Chunks only their own rank needs are read by it, never announced.
        alone = sorted(
            (k, i) for k in by_key if k not in shared_keys for i in range(len(by_key[k]["parts"]))
        )
        run = _Run(self, dests, by_key, read_part, stats)
        if not any_shared:  # no chunk needed by two ranks: no plan to agree on, no gathers
            error = run.go(alone, [], _Plan(self.world, [{}] * self.world), set(by_key), None)
            self.bytes_local = 0
            self._agree_or_raise(error)
            return
        mine = {
            k: (
                [p["raw_size"] for p in rec["parts"]],
                dests.on_gpu(k),
                dests.host_ptr(k),
                [p["object"] if p.get("span") is not None else None for p in rec["parts"]],
            )
            for k, rec in by_key.items()
            if k in shared_keys
        }
        info, token = coop_local.probe_info() if self.local else (None, None)
        announced: list = [None] * self.world
        dist.all_gather_object(announced, (mine, info), group=self.group)
        plan = _Plan(self.world, [a[0] for a in announced])
        shared = [u for u in plan.owners if plan.count[u] > 1]
        local = self._local(plan, shared, announced, by_key) if self.local else None
        del token  # every peer has probed it (the gather in _local)
        is_local = set() if local is None else local[0]
        bcast = interleave(sorted(u for u in shared if u not in is_local), plan.owners)
        own = [u for u in bcast if plan.owners[u] == self.rank]
        own += sorted(u for u in plan.owners if plan.count[u] == 1 and plan.owners[u] == self.rank)
        own += alone
        error = run.go(own, bcast, plan, set(by_key), None if local is None else local[1])
        self.bytes_local = run.bytes_local
        self._agree_or_raise(error)

    def _shared(self, by_key: dict) -> tuple[set, bool]:
        """(this rank's chunks that another rank needs too, whether any rank shares a chunk):
        one all-reduce of a count per stored chunk (what every rank needs, announced to every
        rank as objects, grew with ranks x tensors on every rank: issue 36)."""
        if self.index is None:
            return set(by_key), True
        counts = torch.zeros(len(self.index), dtype=torch.int32)
        pos = {k: self.index[id(rec)] for k, rec in by_key.items()}
        if pos:
            counts[list(pos.values())] = 1
        dist.all_reduce(counts, group=self.group)
        shared = {k for k, p in pos.items() if counts[p] > 1}
        return shared, bool((counts > 1).any())

    def _local(self, plan: _Plan, shared: list, announced: list, by_key: dict):
        """(the parts copied by memory, LocalPhase's arguments but the run and pool) — every
        rank computes the same set from what all announced and probed."""
        row = coop_local.probe_row([a[1] for a in announced], self.rank)
        own_local = [u for u in sorted(shared) if plan.owners[u] == self.rank]
        flags = np.zeros(len(own_local) + 1, dtype=np.uint8)  # candidates; trimmed below
        gathered: list = [None] * self.world
        dist.all_gather_object(gathered, (row, os.getpid(), flags.ctypes.data), group=self.group)
        reach = coop_local.reach([g[0] for g in gathered])
        units = largest_first([u for u in shared if plan.by_memory(u, reach)], plan.sizes)
        per_owner: dict = {}
        for u in units:
            per_owner.setdefault(plan.owners[u], []).append(u)
        own = [(u, pos) for pos, u in enumerate(per_owner.get(self.rank, []))]
        flags = flags[: len(own) + 1]  # the first len(own) flags, then the error flag
        needed, remote = {}, {}
        for o, us in per_owner.items():
            want = [(u, pos, plan.ptrs[(o, u)]) for pos, u in enumerate(us) if u[0] in by_key]
            if o != self.rank and want:
                needed[o] = want
                remote[o] = (gathered[o][1], gathered[o][2], len(us) + 1)
        return set(units), (own, flags, needed, remote)

    def _agree_or_raise(self, error: Exception | None) -> None:
        if isinstance(error, coop_local.PeerFailed):
            error = None  # the failing rank reports its own error: raise that one below
        if not any_rank(error is not None, self.group):  # messages gathered only on failure
            return
        errors: list = [None] * self.world
        dist.all_gather_object(errors, None if error is None else str(error), group=self.group)
        if error is not None:
            raise error
        bad = [(r, e) for r, e in enumerate(errors) if e]
        if bad:
            raise CorruptCheckpoint(f"rank {bad[0][0]} could not read its share: {bad[0][1]}")


class _Run:
    """One cooperative load on this rank: the owned parts are read in a thread pool at most
    `threads` parts ahead of the broadcast loop on the calling thread.

    A failed read stops further reads, but this rank still takes part in every broadcast
    (sending whatever its buffer holds), so no rank waits forever; every rank then raises."""

    def __init__(self, ex: Exchange, dests: _Dests, by_key: dict, read_part, stats):
        self.ex, self.dests, self.by_key, self.read_part, self.stats = (
            ex,
            dests,
            by_key,
            read_part,
            stats,
        )
        self.error: Exception | None = None
        self.offsets = {}  # (key, part index) -> byte offset in the chunk
        for k, rec in by_key.items():
            pos = 0
            for i, p in enumerate(rec["parts"]):
                self.offsets[(k, i)] = pos
                pos += p["raw_size"]
        self._scratch: dict = {}
        self.bytes_local = 0  # copied out of same-host peers' memory (coop_local.py)

    def _slice(self, u) -> torch.Tensor:
        k, i = u
        off = self.offsets[u]
        return self.dests.view(k)[off : off + self.by_key[k]["parts"][i]["raw_size"]]

    def _read(self, u) -> None:
        """Decode an owned part into place (a GPU destination through host memory)."""
        if self.error is not None:
            return
        part = self.by_key[u[0]]["parts"][u[1]]
        try:
            dst = self._slice(u)
            if dst.is_cuda:
                host = np.empty(part["raw_size"], dtype=np.uint8)
                self.read_part(part, host)
                dst.copy_(torch.from_numpy(host))
            else:
                self.read_part(part, dst.numpy())
        except Exception as exc:  # reported to every rank at the end
            self.error = self.error or exc

    def _done(self, key: str) -> None:
        try:
            self.dests.part_done(key)
        except Exception as exc:  # e.g. a value the safe decoding refuses
            self.error = self.error or exc

    def _buffer(self, u, owner: bool, size: int, on_dev: bool, needed: bool):
        """(the tensor to broadcast, a copy to run after it or None) for one shared part."""
        if not needed:  # this rank takes part in the broadcast only: a reused scratch buffer
            dev = "cuda" if on_dev else "cpu"
            buf = self._scratch.get(dev)
            if buf is None or buf.numel() < size:
                buf = self._scratch[dev] = torch.empty(size, dtype=torch.uint8, device=dev)
            return buf[:size], None
        view = self._slice(u)
        if view.is_cuda and not on_dev:  # a GPU destination exchanged over gloo
            host = view.cpu() if owner else torch.empty(size, dtype=torch.uint8)
            return host, (None if owner else lambda: view.copy_(host))
        return view, None

    def go(self, own: list, shared: list, plan: _Plan, mine: set, local) -> Exception | None:
        """The parts copied by memory first (LocalPhase, when `local` is given), then the
        broadcast ones in `shared` order, then the parts only this rank needs."""
        ex, window = self.ex, max(1, self.ex.threads)
        owners, sizes = plan.owners, plan.sizes
        work, inflight = deque(own), deque()
        with ThreadPoolExecutor(max_workers=ex.threads, thread_name_prefix="ckpt-coop") as pool:
            if local is not None:
                phase = coop_local.LocalPhase(self, pool, *local)
                phase.go()
                self.bytes_local = phase.bytes_copied
                self.stats.bytes_received += phase.bytes_copied

            temp = 0  # owned parts in flight whose chunk needs a temporary buffer

            def top_up():
                nonlocal temp
                # Reads into a chunk's own destination hold no memory: they run ahead of the
                # broadcast as far as they go (limited to `threads` parts, a slow exchange
                # stalled reads that a storage link could have served meanwhile). Only parts
                # through a temporary buffer wait for the window.
                while work and (self.dests.is_direct(work[0][0]) or temp < window):
                    u = work.popleft()
                    temp += not self.dests.is_direct(u[0])
                    inflight.append((u, pool.submit(self._read, u)))

            def pop():
                nonlocal temp
                u, fut = inflight.popleft()
                temp -= not self.dests.is_direct(u[0])
                return u, fut

            for u in shared:
                top_up()
                owner = owners[u] == ex.rank
                if owner:  # owned shared parts were queued in this same order
                    pop()[1].result()
                on_dev = plan.gpu[u] and ex.device_group is not None
                buf, after = self._buffer(u, owner, sizes[u], on_dev, u[0] in mine)
                if sizes[u]:
                    group = ex.device_group if on_dev else ex.group
                    dist.broadcast(buf, group_src=owners[u], group=group)
                if after is not None:
                    after()
                if u[0] in mine:
                    self.stats.bytes_received += 0 if owner else sizes[u]
                    self._done(u[0])
            while work or inflight:  # parts only this rank needs
                top_up()
                u, fut = pop()
                fut.result()
                self._done(u[0])
        return self.error

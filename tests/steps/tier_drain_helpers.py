"""Local pieces for the drain's tests (tests/steps/test_tier_drain*.py), built the way the design
of issue 35 lays them out (ckptflow/core/tier.py): each rank saves with a Checkpointer into its
own rank root (DCP's global plan: each rank writes its own items, rank 0 the manifest, marker
and COMMIT), then a fan-out gives every rank the marker, manifest, COMMIT and the objects of the
shared items, and each writes its PIECE last. A stand-in for the local tier's own save (the
drain reads only the layout), and a storage that counts what a drain asks of the durable root.
"""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist
from ckptflow.steps.checkpoint import Checkpointer

from ckptflow.core import layout, rootreader, tier
from ckptflow.core.storage import Storage

SHARED = "shared."  # items every rank holds (DCP writes each once): every piece lists them


def rank_state(rank: int, step: int, seed: int = 0, changed: bool = False) -> dict:
    """Rank `rank`'s state: tensors of its own (`r<rank>.`), and shared items. `changed`:
    its `b` differs (the rest is the same as with `changed` False)."""
    g = torch.Generator().manual_seed(seed * 100 + rank)
    w = torch.randn(256, 64, generator=g)  # 64 KiB: under pack_kib, packed with others
    big = torch.randn(96, 1024, generator=g)  # 384 KiB raw: an object of its own (pack_kib 256)
    b = torch.randn(100, generator=g) + (1.0 if changed else 0.0)
    return {
        f"r{rank}.w": w,
        f"r{rank}.big": big,
        f"r{rank}.b": b,
        f"{SHARED}step": step,
        f"{SHARED}lr": torch.full((8,), 0.5),
    }


def local_checkpointer(local_dir: str, durable: str, rank: int) -> Checkpointer:
    """This rank's local Checkpointer on its rank root (compress=False: the bytes as a
    durable save of this host would store them are not the point here)."""
    root = tier.piece_root(local_dir, tier.run_key(durable), rank)
    # one manifest, as LocalTier's own Checkpointer (its fan-out and PIECE name one)
    return Checkpointer(root, pack_kib=256, compress=False, manifests="step")


def _broadcast(obj, world: int):
    if world == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def save_piece(ck: Checkpointer, step: int, state: dict) -> tier.Piece:
    """A local save of `step` into each rank's root, its fan-out and this rank's PIECE
    (collective over the default group when distributed)."""
    ck.save(step, state)
    st, rank, world = ck.storage, ck.rank, ck.world_size
    files = None
    if rank == 0:
        commit = rootreader.read_commit(st, step)
        name = layout.manifest_name(commit["save_id"])
        sd = layout.step_dir(step)
        files = {
            rel: st.read(rel)
            for rel in (layout.ROOT_MARKER, f"{sd}/{name}", layout.commit_path(step))
        }
    files = _broadcast(files, world)
    for rel, blob in files.items():
        if not st.exists(rel):
            st.write(rel, blob)
    m = rootreader.read_manifest(st, step)
    needs: dict[str, int] = {}
    shared: set[str] = set()
    for rec in m["items"].values():
        mine = rec["fqn"].startswith(f"r{rank}.") or world == 1  # one rank needs all
        if not (mine or rec["fqn"].startswith(SHARED)):
            continue
        for p in rec["parts"]:
            for ref in (p, p.get("base")):
                if ref is not None:
                    needs[ref["object"]] = ref["stored_size"]
                    if not mine:
                        shared.add(ref["object"])
    # the shared items' objects: from whichever rank wrote them
    have = {k: st.read(layout.object_path(k)) for k in shared if st.exists(layout.object_path(k))}
    every = [have] if world == 1 else [None] * world
    if world > 1:
        dist.all_gather_object(every, have)
    for got in every:
        for k, blob in got.items():
            if not st.exists(layout.object_path(k)):
                st.write(layout.object_path(k), blob)
    piece = tier.new_piece(rank, world, step, layout.manifest_name(m["save_id"]), needs)
    tier.write_piece(st, piece)
    return piece


class CountingStorage(Storage):
    """A Storage that counts the object writes (keys) and size looks a drain makes."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.lock = threading.Lock()
        self.written: list[str] = []
        self.sized = 0

    def write(self, rel, data, **kw):
        if rel.startswith(f"{layout.OBJECTS}/"):
            with self.lock:
                self.written.append(rel.rsplit("/", 1)[-1])
        return super().write(rel, data, **kw)

    def size(self, rel):
        with self.lock:
            self.sized += 1
        return super().size(rel)


class DownStorage(Storage):
    """A Storage whose object uploads fail as an unreachable object store's do."""

    def write(self, rel, data, **kw):
        if rel.startswith(f"{layout.OBJECTS}/"):
            raise ConnectionError(f"{self.url(rel)}: endpoint unreachable")
        return super().write(rel, data, **kw)

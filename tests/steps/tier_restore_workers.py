"""Workers of the local tier's restore tests (tests/steps/test_tier_restore*.py): 2 gloo ranks,
each on a simulated node (its own local_dir under `base`), a durable root, local pieces and
peer replicas built the way the layout says (ckptflow.core.tier), B's side channel for fetches.

Each rank's state: its own tensor (`mine/rank<r>`: written by that rank alone), a shared one
(written by one rank, needed by all) and the step; values differ per step, so the step
loaded is read off the tensors."""

from __future__ import annotations

import json
import os
import shutil

import torch
import torch.distributed as dist
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.checkpoint.tier import peers
from ckptflow.steps.checkpoint.tier.restore import TierSource, restore

from ckptflow.core import layout, rootreader, tier
from ckptflow.core.storage import Storage

N = 1 << 16  # floats per tensor: 256 KiB, random (incompressible), so store reads show


def values(step: int, salt: int) -> torch.Tensor:
    return torch.randn(N, generator=torch.Generator().manual_seed(step * 1000 + salt))


def state_of(step: int, rank: int) -> dict:
    return {
        "mine": {f"rank{rank}": values(step, rank)},
        "shared": values(step, 999),
        "step": step,
        "rng": {f"rank{rank}": torch.tensor([step, rank])},
    }


def empty(rank: int) -> tuple[dict, dict]:
    """(train state, rng state) templates to load into."""
    return (
        {"mine": {f"rank{rank}": torch.zeros(N)}, "shared": torch.zeros(N), "step": -1},
        {"rng": {f"rank{rank}": torch.zeros(2, dtype=torch.int64)}},
    )


def node(base: str, r: int) -> str:
    return f"{base}/node{r}"


def durable(base: str) -> str:
    return f"{base}/durable"


def copy_piece(scratch: str, step: int, rank: int, world: int, dest: str) -> None:
    """Rank `rank`'s piece of `step` under root `dest` from the gang's save in `scratch`:
    marker, manifest, COMMIT, the manifest's objects, then the PIECE (last)."""
    src = Storage(scratch)
    m = rootreader.read_manifest(src, step)
    commit = rootreader.read_commit(src, step)
    name = layout.manifest_name(commit["save_id"])
    objects = {k: int(v["size"]) for k, v in m["objects"].items()}
    piece = tier.new_piece(rank, world, step, name, objects)
    out = Storage(dest)
    for rel in tier.piece_files(piece)[:-1]:
        os.makedirs(os.path.dirname(out.path(rel)), exist_ok=True)
        shutil.copyfile(src.path(rel), out.path(rel))
    tier.write_piece(out, piece)


def build(base: str, rank: int, world: int, *, durable_steps, local_steps, replicas=()) -> str:
    """Durable saves of `durable_steps`; local pieces of `local_steps` on every rank's node;
    replicas (steps in `replicas`) of each rank's piece on the next node. The run key."""
    ck = Checkpointer(durable(base))
    for s in durable_steps:
        ck.save(s, state_of(s, rank))
    key = tier.run_key(ck.root)
    ck.close()
    # the local tier saves one manifest (its on_commit fan-out: rank_save.choose)
    scratch = Checkpointer(f"{base}/scratch", manifests="step")
    for s in local_steps:
        scratch.save(s, state_of(s, rank))
    scratch.close()
    for s in local_steps:
        copy_piece(scratch.root, s, rank, world, tier.piece_root(node(base, rank), key, rank))
        if s in replicas:
            other = node(base, (rank + 1) % world)
            copy_piece(scratch.root, s, rank, world, tier.piece_root(other, key, rank))
    dist.barrier()
    return key


def restore_worker(rank: int, world: int, base: str, out: str) -> None:
    """Restore on every rank (with B's side channel up), write what was loaded to out.<rank>."""
    key = tier.run_key(Storage(durable(base)).uri)
    local = node(base, rank)
    os.makedirs(local, exist_ok=True)
    link = peers.PeerLink(local, key, rank)
    directory = peers.PeerDirectory.gather(dist.group.WORLD, rank, f"node{rank}", link)
    ck = Checkpointer(durable(base))
    state, rng = empty(rank)
    try:
        found = restore(ck, state, TierSource(local, key, directory, peers.fetch))
        if found.step is not None:
            found.load(rng)
        found.measure()
        found.close()
    finally:
        dist.barrier()  # every rank's server up until all fetched
        link.close()
        ck.close()
    exp = state_of(found.step, rank) if found.step is not None else None
    doc = {
        "step": found.step,
        "source": found.source,
        "store_bytes": found.store_bytes,
        "skipped": found.skipped,
        "loaded_step": state["step"],
        "mine_ok": exp is not None
        and torch.equal(state["mine"][f"rank{rank}"], exp["mine"][f"rank{rank}"]),
        "shared_ok": exp is not None and torch.equal(state["shared"], exp["shared"]),
        "rng": rng["rng"][f"rank{rank}"].tolist(),
    }
    with open(f"{out}.{rank}", "w") as f:
        json.dump(doc, f)


def setup_worker(rank: int, world: int, base: str, spec: dict) -> None:
    build(
        base,
        rank,
        world,
        durable_steps=spec.get("durable", ()),
        local_steps=spec.get("local", ()),
        replicas=spec.get("replicas", ()),
    )

"""The commit of a save: every object the manifest names is checked present, then the commit
marker is claimed with an exclusive create (the one step that makes a save visible).

A Checkpointer commits with every rank: after DCP's save (the manifest written by rank 0),
each rank checks the objects its own parts reference (a stat or HEAD each; borrowed ones
in the parent roots), the ranks agree over the save's group, and only then rank 0 claims
the marker and tells the others whether it won. Rank 0 used to check every object of the step
itself: one listing per key-prefix folder of every rank's objects, up to the whole objects
tree (256 folders) per save, growing with ranks x tensors while every other rank waited
(issue 36). A writer used alone (no Checkpointer) still checks everything and commits in
`finish` (`commit_alone`).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist
from ckptflow.steps.checkpoint.save_job import SaveJob

from ckptflow.core import layout, listing
from ckptflow.core.errors import CheckpointError
from ckptflow.core.storage import AlreadyExists, Storage

_MISSING_HINT = (
    "save again (were they freed by a `ckptflow ckpt gc` while this save's heartbeat "
    "lapsed, or lost by the storage?)"
)


def record(job: SaveJob, manifest_name: str, manifest_xxh3: str, version: int = 0) -> dict:
    """The commit marker's content: which manifest this step is (the one just written);
    `version` 5: a step index of per-rank manifests (rootreader.read_index)."""
    out = {
        "save_id": job.save_id,
        "manifest": manifest_name,
        "manifest_xxh3": manifest_xxh3,
        "root_id": job.root_id,  # the root's id survives a lost root marker (rootreader)
        "step": job.step,
        "committed_at": time.time(),
    }
    if version:
        out["format_version"] = version
    return out


def own_objects(job: SaveJob) -> dict[str, int]:
    """Object key -> stored size of every object this rank's parts reference (delta bases
    included): what this rank checks before the commit."""
    out: dict[str, int] = {}
    for rec in job.part_records:
        for ref in (rec, rec.get("base")):
            if ref is not None and ref.get("object"):
                out[ref["object"]] = ref["stored_size"]
    return out


def _own_sizes(storage: Storage, keys: list[str]) -> dict[str, int | None]:
    """The stored size of each object (None: not in the root), one look each (a stat, a HEAD):
    O(its own objects), where listing their key-prefix folders read every rank's objects
    in them, of every step the root keeps."""

    def one(key: str) -> tuple[str, int | None]:
        try:
            return key, storage.size(layout.object_path(key))
        except FileNotFoundError:
            return key, None

    if storage.protocol == "file" or len(keys) <= 1:
        return dict(map(one, keys))
    with ThreadPoolExecutor(min(listing.LIST_THREADS, len(keys)), "ckpt-check") as pool:
        return dict(pool.map(one, keys))


def _missing_own(storage: Storage, sizes: dict[str, int]) -> list[str]:
    """listing.missing_objects for one rank's few objects: a look at each."""
    have = _own_sizes(storage, sorted(sizes))
    have |= listing.borrowed_sizes(storage, [k for k, n in have.items() if n is None])
    return listing.size_problems(storage, sizes, have)


def missing(job: SaveJob, sizes: dict[str, int], who: str = "", *, own=True) -> str | None:
    """One line naming what is missing or damaged among `sizes` (in the root or, borrowed,
    in a parent root), or None when all is there. `own`: a rank's own objects, looked at one
    by one; else every object of a step, by listing their key-prefix folders."""
    st = job.storage
    bad = _missing_own(st, sizes) if own else listing.missing_objects(st, sizes)
    if not bad:
        return None
    return (
        f"step {job.step} under {job.storage.uri} was not committed: {len(bad)} object(s) "
        f"it needs{who} are missing or damaged ({'; '.join(bad[:3])}); {_MISSING_HINT}"
    )


def claim(job: SaveJob, commit: dict) -> None:
    """Claim the commit marker (exclusive create): CheckpointError when another writer has."""
    try:
        job.storage.write(layout.commit_path(job.step), json.dumps(commit).encode(), exclusive=True)
    except AlreadyExists:
        raise CheckpointError(
            f"step {job.step} under {job.storage.uri} was committed by another writer while "
            "this save ran; nothing of the other checkpoint was changed: save under a new "
            "step number"
        ) from None


def commit_alone(job: SaveJob, objects: dict[str, int], commit: dict) -> None:
    """One process checks every object of the manifest and claims the marker."""
    problem = missing(job, objects, own=False)
    if problem:
        raise CheckpointError(problem)
    claim(job, commit)


def first(flag: int, group, world: int) -> int:
    """The lowest rank whose `flag` is set (`world` when none), agreed by every rank (a
    process alone, `group` None: its own)."""
    if group is None:
        return flag
    t = torch.tensor([flag], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return int(t.item()) if t.item() < world else world


def commit_together(job: SaveJob, rank: int, world: int, group) -> None:
    """Every rank checks its own objects; rank 0 then claims the marker (`job.commit`, set by
    its writer's finish). Collective over `group` (None: a process alone): every rank returns
    or raises together."""
    problem = missing(job, own_objects(job), f" (of rank {rank})")
    first_bad = first(rank if problem else world, group, world)
    if first_bad < world:
        raise CheckpointError(
            problem
            or (
                f"step {job.step} under {job.storage.uri} was not committed: objects of rank "
                f"{first_bad} are missing or damaged (its log names them); {_MISSING_HINT}"
            )
        )
    error: BaseException | None = None
    if rank == 0:
        try:
            claim(job, job.commit)
        except BaseException as exc:  # every rank must hear of it: none may report success
            error = exc
    if first(0 if error is not None else world, group, world) < world:
        if error is not None:
            raise error
        raise CheckpointError(
            f"step {job.step} under {job.storage.uri} was not committed: rank 0 could not "
            "claim its commit marker (its log says why)"
        )

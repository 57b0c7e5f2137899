"""Saving with per-rank manifests (format 5, issue 36): each rank plans, writes and describes
its own items alone; rank 0 only gathers one small record per rank, writes the step index and
claims COMMIT (ckptflow.core.rankmanifest has the format).

Why DCP runs with `no_dist=True` on each rank (rather than `use_collectives=False`): both plan
each rank alone (its local plan is its global plan, `finish` gets its own metadata and
results), but use_collectives=False still ends with a barrier over the group and passes
is_coordinator by rank; with no_dist DCP does nothing across ranks, and the three small
collectives a save needs (start, gather, outcome) are ours, below.

Replicated (non-DTensor) items: every rank writes the ones it holds, as its own. Without
DCP's gather no rank can tell a replicated item (the same FQN on every rank, e.g. AdamW's step
counters) from one only it holds (`rng/rank3`), so each keeps its own; their bytes are equal,
so are their content-addressed objects, and the merge keeps the lowest rank's copy (as DCP's
deduplication keeps one). Each rank's load then reads only the index and its own manifest. The
cost: a replicated byte is written once per rank (DDP-style fully replicated models write the
model W times): `manifests="auto"` picks this format only for mostly sharded states.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from ckptflow.steps.checkpoint import commit
from ckptflow.steps.checkpoint.save_job import SaveJob
from ckptflow.steps.checkpoint.save_manifest import (  # noqa: F401  (the benchmark's names)
    build_rank_manifest,
    rank_manifest,
)
from ckptflow.steps.checkpoint.writer import CkptStorageWriter, SafeSavePlanner
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.tensor import DTensor

from ckptflow.core import codec, layout, rankmanifest, rootreader
from ckptflow.core import manifest as mf
from ckptflow.core.errors import CheckpointError

log = logging.getLogger("ckptflow.checkpoint")

MODES = ("auto", "step", "rank")
# `auto` uses rank manifests from this many ranks: they saved 0.67-0.89x and loaded 0.34-0.56x
# the time of one manifest at 4 to 64 ranks (docs/benchmarks.md "Scale"); one process keeps
# the single manifest (the same file, and readable by ckptflow before format 5)
AUTO_FROM_RANKS = 2
AUTO_MAX_REPLICATED = 64 << 20  # ... when each rank holds at most this many replicated bytes


def replicated_bytes(state_dict: dict) -> int:
    """Bytes of the plain (non-DTensor) tensors of a state dict: what every rank would write."""
    flat, _ = flatten_state_dict(state_dict)
    return sum(
        v.numel() * v.element_size()
        for v in flat.values()
        if isinstance(v, torch.Tensor) and not isinstance(v, DTensor)
    )


def choose(mode: str, world: int, state_dict: dict, unsupported: str | None) -> bool:
    """Whether this save writes per-rank manifests. Every rank decides alike without a
    collective (world size, options and its replicated items are the same on every rank).
    `unsupported`: what this save needs that rank manifests do not do yet (one log line, then
    the single manifest)."""
    if mode == "step":
        return False
    if mode == "auto" and world < AUTO_FROM_RANKS:
        return False
    if unsupported is not None:  # asked for ("rank"): said once a save; "auto": quietly
        level = logging.INFO if mode == "rank" else logging.DEBUG
        log.log(level, "saving with one manifest, not per-rank manifests: %s", unsupported)
        return False
    # (`auto`: every rank would write the replicated bytes, see the module docstring)
    return mode == "rank" or replicated_bytes(state_dict) <= AUTO_MAX_REPLICATED


# -- one rank's part (the functions benchmarks/scale_sim_v5.py times) ---------------------------
def local_plan(state_dict: dict, rank: int):
    """(this rank's final SavePlan, DCP Metadata of its own entries): DCP's planning of one rank
    alone, as `dcp.save(no_dist=True)` runs it."""
    planner = SafeSavePlanner()
    planner.set_up_planner(state_dict, storage_meta=None, is_coordinator=rank == 0)
    plan = planner.create_local_plan()
    plans, md = planner.create_global_plan([plan])
    return planner.finish_plan(plans[0]), md


def commit_index(job: SaveJob, storage, records: list[dict]) -> bytes:
    """Rank 0: the step index from every rank's record, written, then COMMIT claimed
    (CheckpointError when another writer claimed it). O(ranks), no work per chunk."""
    header = getattr(job, "rank_header", None) or {"kind": job.kind, "base_step": job.base_step}
    save = {
        "step": job.step,
        "save_id": job.save_id,
        "root_id": job.root_id,
        "world_size": job.world_size,
        "kind": header["kind"],
        "base_step": header["base_step"],
        "metadata": {k: v for k, v in job.metadata.items() if not k.startswith("_")},
        "library": header.get("library", {}),
    }
    try:
        index = rankmanifest.build_index(save, records)
    except mf.ManifestError as exc:
        raise CheckpointError(
            f"step {job.step} under {storage.uri} was not committed: the ranks' records do not "
            f"make a step index ({exc})"
        ) from exc
    blob = mf.dumps(index)
    name = layout.manifest_name(job.save_id)
    storage.write(f"{layout.step_dir(job.step)}/{name}", blob)
    job.commit = commit.record(job, name, codec.digest(blob), layout.RANKS_VERSION)
    commit.claim(job, job.commit)
    return blob


# -- the save, on every rank ---------------------------------------------------------------------
def _broadcast(obj, group):
    if group is None:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def start(job: SaveJob, writer: CkptStorageWriter, parent: dict | None, group) -> None:
    """Rank 0 claims the root and writes the save's intent before any rank writes (GC then
    knows the save is live); every rank learns the root id and save id (or rank 0's error)."""
    outcome: object = None
    if job.rank == 0:
        try:
            job.root_id = rootreader.ensure_root(job.storage, parent)
            writer.start()
            outcome = (job.root_id, job.save_id)
        except BaseException as exc:  # every rank must hear of it, or they wait forever
            _broadcast(CheckpointError(str(exc)), group)
            raise
    got = _broadcast(outcome, group)
    if isinstance(got, BaseException):
        raise CheckpointError(f"step {job.step} was not saved: rank 0 failed to start it ({got})")
    job.root_id, job.save_id = got  # (each rank drew a save id: rank 0's names the save)


def save(job: SaveJob, writer: CkptStorageWriter, state_dict: dict, group, parent=None) -> None:
    """One save with per-rank manifests (collective over `group`: every rank returns or raises
    together): start, this rank's DCP save and manifest, then `finish_together`."""
    start(job, writer, parent, group)
    try:
        dcp.save(state_dict, storage_writer=writer, planner=SafeSavePlanner(), no_dist=True)
        failure = None
    except BaseException as exc:  # the others still gather: they must not wait forever
        failure = exc
    finish_together(job, group, failure)


def finish_together(job: SaveJob, group, failure: BaseException | None = None) -> None:
    """Every rank checks its own objects and gathers (its record, or what went wrong) to rank 0,
    which writes the index and claims COMMIT; then every rank learns whether it committed."""
    world, rank = job.world_size, job.rank
    # Every rank's writes end before any rank checks its objects: ranks holding equal bytes
    # (replicated items) write the same object, and a local write in progress truncates the
    # copy another rank finished (its check then found 0 bytes; under DCP's collectives the
    # checks ran after every write ended too).
    if group is not None:
        dist.barrier(group=group)
    problem = None
    if failure is None:
        problem = commit.missing(job, commit.own_objects(job), f" (of rank {rank})")
    else:
        problem = f"rank {rank} failed to write ({type(failure).__name__}: {failure})"
    mine = {"error": problem} if problem else {"record": job.rank_record}
    gathered = [mine]
    if group is not None:
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(mine, gathered, dst=0, group=group)
    error: BaseException | None = None
    if rank == 0:
        try:
            bad = [g["error"] for g in gathered if "error" in g]
            if bad:
                raise CheckpointError(
                    f"step {job.step} under {job.storage.uri} was not committed: {bad[0]}"
                    + (f" (and {len(bad) - 1} other rank(s))" if len(bad) > 1 else "")
                )
            commit_index(job, job.storage, [g["record"] for g in gathered])
        except BaseException as exc:
            error = exc
    if commit.first(0 if error is not None else world, group, world) < world:
        if failure is not None:
            raise failure
        if error is not None:
            raise error
        raise CheckpointError(
            problem
            or f"step {job.step} under {job.storage.uri} was not committed: rank 0 could not "
            "write its step index or claim its commit marker (its log says why)"
        )

"""Loading a step saved with per-rank manifests (format 5, issue 36) at the world size that
saved it: each rank plans from the step index and its own rank manifest alone
(ckptflow.core.rankview.read_rank_view), with no central load plan and nothing read of
the other ranks. Whatever that view cannot load exactly (another world size, another layout
of the shards, a key it lacks) is loaded from the merged manifest instead (load_path.py).
"""

from __future__ import annotations

import math

import torch
from ckptflow.steps.checkpoint import dcp_metadata
from ckptflow.steps.checkpoint.reader import SafeLoadPlanner
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan
from torch.distributed.tensor import DTensor

from ckptflow.core import rankview
from ckptflow.core.errors import CheckpointError
from ckptflow.core.storage import Storage


class NotCovered(CheckpointError):
    """A rank's own manifest does not hold every element its state dict loads (resharding)."""


def load_metadata(storage: Storage, step: int, rank: int, only: set[str] | None):
    """(DCP Metadata one rank plans its load with, bytes of manifest read): from the step index
    and its own rank manifest. ValueError when the step has no per-rank manifests."""
    got = rankview.read_rank_view(storage, step, rank, only)
    if got is None:
        raise ValueError(f"step {step} under {storage.uri} has no per-rank manifests")
    view, size = got
    return dcp_metadata.metadata_from_manifest(view, only), size


def read_view(storage: Storage, step: int, rank: int, world: int, only: set[str]) -> dict | None:
    """This rank's view of a format-5 step saved by `world` ranks, or None (then the merged
    manifest is read)."""
    got = rankview.read_rank_view(storage, step, rank, only, world_size=world)
    return None if got is None else got[0]


def _expected(obj) -> int | None:
    """Elements of `obj` this rank loads (its shard of a DTensor); None for a non-tensor."""
    if isinstance(obj, DTensor):
        if obj.device_mesh.get_coordinate() is None:
            return 0  # not on this rank's part of the mesh: nothing to load
        return obj.to_local().numel()
    if isinstance(obj, torch.Tensor):
        return obj.numel()
    return None


class CoveredLoadPlanner(SafeLoadPlanner):
    """SafeLoadPlanner that refuses (NotCovered) a plan leaving part of a destination unread:
    a rank's chunks in its own manifest never overlap (validated), so reads that add up to
    each destination's size cover it exactly. DCP would leave an uncovered region as it was."""

    def create_local_plan(self) -> LoadPlan:
        plan = super().create_local_plan()
        read: dict[str, int] = {}
        for ri in plan.items:
            if ri.type != LoadItemType.BYTE_IO:
                fqn = ri.dest_index.fqn
                read[fqn] = read.get(fqn, 0) + math.prod(ri.lengths)
        for fqn, obj in self.state_dict.items():
            want = _expected(obj)
            if want is not None and read.get(fqn, 0) != want:
                raise NotCovered(f"{fqn}: this rank's manifest covers {read.get(fqn, 0)} of {want}")
        return plan

"""The manifest of a save, built from DCP's metadata and every rank's write results
(CkptStorageWriter.finish, writer.py, writes it; commit.py checks its objects and commits)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
from ckptflow.steps.checkpoint import dcp_metadata
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.storage import WriteResult

from ckptflow.core import adaptive, layout
from ckptflow.core import manifest as mf
from ckptflow.core.errors import CheckpointError

if TYPE_CHECKING:  # annotation only: writer.py imports this module
    from ckptflow.steps.checkpoint.save_job import SaveJob

VERSION = "0.1.0"


def build_manifest(job: SaveJob, metadata: Metadata, results: list[WriteResult]) -> dict:
    """The JSON manifest of a save from DCP's metadata and every rank's write results."""
    tensors, values = dcp_metadata.metadata_to_json(metadata)
    items, objects = {}, {}
    raw_total = new_total = compressed = 0
    for wr in results:
        rec = wr.storage_data
        key = mf.item_key(rec["fqn"], rec["offset"])
        if key in items:  # two items under one key: one of them would be lost
            raise CheckpointError(f"two write items share the manifest key {key!r}")
        items[key] = rec
        for p in rec["parts"]:
            raw_total += p["raw_size"]
            new_total += 0 if p.get("reused") else mf.part_bytes(p)
            if any(codec_ != "raw" for codec_, _ in p["planes"]):
                compressed += p["raw_size"]
            objects[p["object"]] = {"size": p["stored_size"]}
            if p["base"] is not None:
                objects[p["base"]["object"]] = {"size": p["base"]["stored_size"]}
    planner = {k: list(v) for k, v in (metadata.planner_data or {}).items()}
    return {
        "format": layout.MANIFEST_FORMAT,
        "format_version": layout.FORMAT_VERSION,
        "root_id": job.root_id,
        "step": job.step,
        "save_id": job.save_id,
        "created_at": time.time(),
        "library": {"ckptflow": VERSION, "torch": torch.__version__.split("+")[0]},
        "world_size": job.world_size,
        "kind": job.kind,
        "base_step": job.base_step,
        "metadata": {k: v for k, v in job.metadata.items() if not k.startswith("_")},
        "tensors": tensors,
        "values": values,
        "items": items,
        "objects": objects,
        "planner_data": planner,
        "stats": {
            "raw_bytes": raw_total,
            "stored_bytes": sum(o["size"] for o in objects.values()),
            "new_bytes": new_total,
            # how `compress` chose (ckpt ls, ckpt stats), and what it stored compressed
            "compression": {
                "mode": adaptive.mode(job.compress, job.policy),
                "compressed_bytes": compressed,
            },
        },
    }

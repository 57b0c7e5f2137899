"""The manifest of a save, built from DCP's metadata and every rank's write results
(CkptStorageWriter.finish, writer.py, writes it; commit.py checks its objects and commits),
and with per-rank manifests (format 5) each rank's manifest of its own entries."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import torch
from ckptflow.steps.checkpoint import dcp_metadata
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.storage import WriteResult

from ckptflow.core import adaptive, jsonfile, layout, rankmanifest
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


# -- per-rank manifests (format 5, rank_save.py) ---------------------------------------------
def build_rank_manifest(job: SaveJob, metadata, results: list, rank: int):
    """(file name, bytes, parsed manifest) of this rank's manifest: serialised, parsed back and
    validated as a reader will (partial: its chunks cover only its shards)."""
    with jsonfile.collector_paused():  # acyclic: see writer.finish
        m = build_manifest(job, metadata, results)
        m["format_version"] = layout.RANKS_VERSION
        m["rank"] = rank
        m["metadata"] = {}  # the user's metadata is the index's (once, not once per rank)
        blob = mf.dumps(m)
        parsed = json.loads(blob)
    try:  # what no reader would accept is never committed
        mf.validate(parsed, partial=True)
    except mf.ManifestError as exc:
        raise CheckpointError(
            f"step {job.step} under {job.storage.uri} was not committed: rank {rank}'s manifest "
            f"is invalid ({exc}); this is a bug in ckptflow, please report it"
        ) from exc
    return layout.rank_manifest_name(job.save_id, rank), blob, parsed


def rank_manifest(job: SaveJob, metadata, results: list, rank: int) -> tuple[str, bytes]:
    """(file name, bytes) of this rank's manifest (build_rank_manifest, without the parse)."""
    name, blob, _ = build_rank_manifest(job, metadata, results, rank)
    return name, blob


def write_rank_manifest(job: SaveJob, metadata, results: list) -> None:
    """Write this rank's manifest (its objects are durable: write_data waited) and keep the
    record it gathers to rank 0 (`job.rank_record`). Called by the writer's finish."""
    name, blob, m = build_rank_manifest(job, metadata, results, job.rank)
    job.storage.write(f"{layout.step_dir(job.step)}/{name}", blob)
    job.rank_record = rankmanifest.rank_record(job.rank, name, blob, m)
    job.rank_header = {k: m[k] for k in ("kind", "base_step", "library")}

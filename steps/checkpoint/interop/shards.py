"""What the export writers share (exporter.py's safetensors and torch.save writers, and
dcp_writer.py): one shard read from the source in the output dtype, and a written file's
record. A module of its own so that dcp_writer need not import exporter, which imports it (an
import cycle, once hidden inside a function)."""

from __future__ import annotations

import hashlib

import torch
from ckptflow.steps.checkpoint.interop.sources import Source

__all__ = ["DTYPES", "file_record", "out_dtype", "read_shard"]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def out_dtype(t: torch.dtype, dtype: str | None) -> torch.dtype:
    """The dtype a tensor of dtype `t` is exported in (`dtype` converts floating point only)."""
    return DTYPES[dtype] if dtype and t.is_floating_point else t


def read_shard(src: Source, names: dict[str, str], shard: list[str], dtype: str | None) -> dict:
    """The shard's entries (exported name -> value), tensors converted and contiguous."""
    got = src.read_many([names[n] for n in shard])
    out = {}
    for n in shard:
        v = got[names[n]]
        if isinstance(v, torch.Tensor):
            v = v.to(out_dtype(v.dtype, dtype)).contiguous()
        out[n] = v
    return out


def file_record(name: str, blob, tensors: int) -> dict:
    """A written file's record; `blob` is its bytes or its list of buffers."""
    bufs = blob if isinstance(blob, list) else [blob]
    digest = hashlib.sha256()
    for buf in bufs:
        digest.update(buf)
    size = sum(memoryview(b).nbytes for b in bufs)
    return {"name": name, "bytes": size, "sha256": digest.hexdigest(), "tensors": tensors}

"""Write a plain DCP checkpoint folder, shard by shard, that stock
`torch.distributed.checkpoint.load` (its FileSystemReader) reads: one `__N_0.distcp` file per
shard holding each tensor (and value) torch.save'd back to back, and `.metadata` last (DCP's
own convention: a folder without it is an unfinished save).
"""

from __future__ import annotations

import io
import pickle

import torch
from ckptflow.steps.checkpoint.interop.shards import file_record, read_shard
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from ckptflow.core.storage import Storage


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    if isinstance(obj, torch.Tensor) and obj.untyped_storage().nbytes() != obj.nbytes:
        obj = obj.clone()  # a view would carry its whole storage
    torch.save(obj, buf)
    return buf.getvalue()


def _path(src, names: dict[str, str], name: str) -> tuple:
    """Where the entry sits in the nested state dict (DCP's planner data): the source's own
    nesting for an entry exported under its own name, else the name alone."""
    known = src.paths.get(names[name]) if name == names[name] else None
    return tuple(known) if known else (name,)


def data_files(n: int) -> list[str]:
    """The data files of a DCP export in `n` shards."""
    return [f"__{i}_0.distcp" for i in range(n)]


def write(src, dest: Storage, names: dict[str, str], shards: list, dtype, info) -> list[dict]:
    """Write the shards (exported names, values among them) and `.metadata`; file records."""
    sdm, storage, files = {}, {}, []
    for i, shard in enumerate(shards):
        rel = f"__{i}_0.distcp"
        parts, pos = [], 0
        for name, obj in read_shard(src, names, shard, dtype).items():
            blob = _saved(obj)
            if isinstance(obj, torch.Tensor):
                zero = torch.Size([0] * obj.dim())
                sdm[name] = TensorStorageMetadata(
                    properties=TensorProperties(dtype=obj.dtype),
                    size=obj.size(),
                    chunks=[ChunkStorageMetadata(offsets=zero, sizes=obj.size())],
                )
                idx = MetadataIndex(name, zero, 0)
            else:
                sdm[name] = BytesStorageMetadata()
                idx = MetadataIndex(name)
            storage[idx] = _StorageInfo(rel, pos, len(blob))
            parts.append(blob)
            pos += len(blob)
        dest.write(rel, parts)  # a list of buffers: never joined into a second copy
        files.append(file_record(rel, parts, len(shard)))
        del parts
    meta = Metadata(
        state_dict_metadata=sdm,
        planner_data={n: _path(src, names, n) for n in sdm},
        storage_data=storage,
        storage_meta=StorageMeta(),
        version="1.0.0",
    )
    dest.write(".metadata", pickle.dumps(meta))
    return files

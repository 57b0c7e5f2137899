"""Read a DCP checkpoint's `.metadata` (a pickle) without ever running code from it.

`pickle.load` would call whatever a planted `__reduce__` names (`os.system`, `open`, ...).
`MetadataUnpickler` resolves only an allow-list of globals: DCP's metadata classes, its
per-file storage record, `torch.Size`, the dtypes ckptflow stores and torch's own layout and
memory-format lookups; anything else is refused before it is called. What it builds is then
checked field by field (`check_metadata`): types, names, shapes, chunk tiling, file names and
byte ranges, so a well-formed but lying pickle is refused as well.
"""

from __future__ import annotations

import io
import pickle

import torch
import torch.distributed.checkpoint.metadata as md
from ckptflow.steps.checkpoint import dcp_metadata
from ckptflow.steps.checkpoint.interop.base import (
    MAX_CHUNKS,
    MAX_TENSORS,
    ForeignFormatError,
    TensorInfo,
    check_dtype,
    check_file_name,
    check_int,
    check_name,
    check_shape,
    fail,
)
from torch.distributed.checkpoint.filesystem import _StorageInfo

from ckptflow.core import tiling


def _path(*parts) -> str:
    """A pickled pathlib path (StorageMeta.checkpoint_id), kept as plain text."""
    if not all(isinstance(p, str) for p in parts) or len(parts) > 256:
        raise TypeError("a path must be made of strings")
    return "/".join(parts).replace("//", "/")


_MD_CLASSES = (
    "Metadata",
    "TensorStorageMetadata",
    "BytesStorageMetadata",
    "TensorProperties",
    "ChunkStorageMetadata",
    "MetadataIndex",
    "StorageMeta",
    "_MEM_FORMAT_ENCODING",
)
ALLOWED = {
    **{("torch.distributed.checkpoint.metadata", n): getattr(md, n) for n in _MD_CLASSES},
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _StorageInfo,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
    **{("torch", name): dt for name, dt in dcp_metadata.DTYPES.items()},
    # StorageMeta.checkpoint_id is the path it was saved to: kept as plain text
    ("pathlib", "PosixPath"): _path,
    ("pathlib", "WindowsPath"): _path,
    ("pathlib", "PurePosixPath"): _path,
    ("collections", "OrderedDict"): dict,
}


class MetadataUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals in ALLOWED (no code from the file runs)."""

    def __init__(self, blob: bytes, where: str):
        super().__init__(io.BytesIO(blob))
        self.where = where

    def find_class(self, module: str, name: str):
        found = ALLOWED.get((module, name))
        if found is None:
            fail(self.where, f"refused: it names {module}.{name}, not a DCP metadata class")
        return found

    def persistent_load(self, pid):
        fail(self.where, "refused: persistent ids are not DCP metadata")


def load_metadata(blob: bytes, where: str) -> md.Metadata:
    """The Metadata pickled in `blob`, built by MetadataUnpickler (ForeignFormatError else)."""
    try:
        obj = MetadataUnpickler(blob, where).load()
    except ForeignFormatError:
        raise
    except (RecursionError, MemoryError):
        fail(where, "nested too deeply or too large")
    except Exception as exc:  # any malformed pickle: truncated, bad opcodes, bad arguments
        fail(where, f"not a DCP metadata pickle ({type(exc).__name__}: {str(exc)[:120]})")
    if not isinstance(obj, md.Metadata):
        fail(where, f"holds a {type(obj).__name__}, not DCP Metadata")
    return obj


def _chunks(sm, where: str, shape: tuple[int, ...]) -> list[tuple[tuple, tuple]]:
    if not isinstance(sm.chunks, list) or not 0 < len(sm.chunks) <= MAX_CHUNKS:
        fail(where, f"chunks must be a list of 1 to {MAX_CHUNKS}")
    out = []
    for c in sm.chunks:
        if not isinstance(c, md.ChunkStorageMetadata):
            fail(where, "a chunk is not ChunkStorageMetadata")
        offs = tuple(check_int(o, where) for o in c.offsets)
        sizes = check_shape(c.sizes, where, sm.properties.dtype)
        if len(offs) != len(shape) or len(sizes) != len(shape):
            fail(where, f"chunk {list(offs)}+{list(sizes)} has not {len(shape)} dimensions")
        if any(o + s > d for o, s, d in zip(offs, sizes, shape, strict=True)):
            fail(where, f"chunk {list(offs)}+{list(sizes)} lies outside {list(shape)}")
        out.append((offs, sizes))
    problem = tiling.problem(list(shape), [(list(o), list(s)) for o, s in out])
    if problem:
        fail(where, problem)
    return out


def _entry(fqn, sm, where: str):
    check_name(fqn, where)
    here = f"{where}: {fqn!r:.200}"
    if isinstance(sm, md.BytesStorageMetadata):
        return None
    if not isinstance(sm, md.TensorStorageMetadata) or not isinstance(
        sm.properties, md.TensorProperties
    ):
        fail(here, f"a {type(sm).__name__} is neither tensor nor bytes metadata")
    dtype = check_dtype(sm.properties.dtype, here)
    shape = check_shape(sm.size, here, dtype)
    return TensorInfo(dtype, shape), _chunks(sm, here, shape)


def _storage(meta: md.Metadata, where: str, tensors: dict, values: set) -> dict:
    """(fqn, chunk offsets or None) -> (file, offset, length), every chunk and value present."""
    if not isinstance(meta.storage_data, dict) or len(meta.storage_data) > MAX_TENSORS * 4:
        fail(where, "storage_data must be a dict of MetadataIndex -> _StorageInfo")
    out = {}
    for idx, info in meta.storage_data.items():
        if not isinstance(idx, md.MetadataIndex) or not isinstance(info, _StorageInfo):
            fail(where, "storage_data must map MetadataIndex to _StorageInfo")
        here = f"{where}: storage of {idx.fqn!r:.200}"
        offset = None if idx.offset is None else tuple(check_int(o, here) for o in idx.offset)
        if info.transform_descriptors:
            fail(
                here,
                f"stored with transforms {list(info.transform_descriptors)[:4]!r:.80}: "
                "not supported (save without a storage transform)",
            )
        rec = (
            check_file_name(info.relative_path, here),
            check_int(info.offset, here),
            check_int(info.length, here),
        )
        out[(idx.fqn, offset)] = rec
    for fqn, (_, chunks) in tensors.items():
        for offs, _sizes in chunks:
            if (fqn, offs) not in out:
                fail(where, f"tensor {fqn!r:.200} chunk at {list(offs)} has no stored data")
    for fqn in values:
        if (fqn, None) not in out:
            fail(where, f"value {fqn!r:.200} has no stored data")
    return out


def check_metadata(meta: md.Metadata, where: str):
    """(tensors: fqn -> (TensorInfo, chunks), values: set of fqns, storage records)."""
    sdm = meta.state_dict_metadata
    if not isinstance(sdm, dict) or len(sdm) > MAX_TENSORS:
        fail(where, f"state_dict_metadata must be a dict of at most {MAX_TENSORS} entries")
    tensors, values = {}, set()
    for fqn, sm in sdm.items():
        got = _entry(fqn, sm, where)
        if got is None:
            values.add(fqn)
        else:
            tensors[fqn] = got
    return tensors, values, _storage(meta, where, tensors, values)

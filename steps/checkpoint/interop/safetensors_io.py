"""Hugging Face safetensors, read with every header field bounded and checked: one file, or a
folder sharded with `model.safetensors.index.json`.

A safetensors file is an 8-byte little-endian header length, a JSON header
(`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}`) and
the tensors' bytes. A hostile header can claim a length beyond the file, offsets outside the
data or overlapping another tensor's, a size that does not match its shape, or an unknown
dtype; each is refused, naming the file, before any tensor is allocated or read.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

import torch
from ckptflow.steps.checkpoint.interop.base import (
    MAX_HEADER,
    MAX_TENSORS,
    TensorInfo,
    check_file_name,
    check_int,
    check_name,
    check_shape,
    fail,
    file_size,
    parse_json,
    read_json,
    read_range,
)

from ckptflow.core.errors import CheckpointError
from ckptflow.core.storage import Storage

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "C64": torch.complex64,
}
NAMES = {v: k for k, v in DTYPES.items()}


@dataclass
class SafetensorsFile:
    """One validated safetensors file: its tensors' declared shapes and byte ranges."""

    storage: Storage
    rel: str
    data_start: int = 0
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.storage.url(self.rel)

    def read(self, name: str) -> torch.Tensor:
        """The tensor `name`, read by its byte range alone (never the whole file)."""
        a, b = self.spans[name]
        blob = read_range(self.storage, self.rel, self.data_start + a, self.data_start + b)
        info = self.tensors[name]
        if not blob:
            return torch.empty(info.shape, dtype=info.dtype)
        return torch.frombuffer(bytearray(blob), dtype=info.dtype).reshape(info.shape)


def open_file(st: Storage, rel: str) -> SafetensorsFile:
    """Parse and check the header of `rel` (a header is read, bounded; no tensor data)."""
    url = st.url(rel)
    size = file_size(st, rel)
    if size < 8:
        fail(url, f"{size} bytes: too short for a safetensors file")
    (n,) = struct.unpack("<Q", read_range(st, rel, 0, 8))
    if n > MAX_HEADER or 8 + n > size:
        fail(url, f"header length {n} exceeds the file ({size} bytes) or {MAX_HEADER} bytes")
    header = parse_json(read_range(st, rel, 8, 8 + n), url, max_bytes=MAX_HEADER, max_depth=4)
    if not isinstance(header, dict):
        fail(url, "the header is not a JSON object")
    f = SafetensorsFile(st, rel, data_start=8 + n)
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
    ):
        fail(url, "__metadata__ must map strings to strings")
    f.metadata = meta
    if len(header) > MAX_TENSORS:
        fail(url, f"{len(header)} tensors: more than {MAX_TENSORS}")
    for name, entry in header.items():
        _entry(f, name, entry, size - f.data_start)
    _no_overlap(f)
    return f


def _entry(f: SafetensorsFile, name: str, entry, data_size: int) -> None:
    where = f"{f.url}: tensor {name!r:.200}"
    check_name(name, where)
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        fail(where, "an entry must hold exactly dtype, shape and data_offsets")
    dtype = DTYPES.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
    if dtype is None:
        fail(where, f"dtype {entry['dtype']!r:.40} is not one of {', '.join(DTYPES)}")
    shape = check_shape(entry["shape"], where, dtype)
    offs = entry["data_offsets"]
    if not isinstance(offs, list) or len(offs) != 2:
        fail(where, "data_offsets must be [begin, end]")
    a, b = (check_int(o, where, 0, data_size) for o in offs)
    info = TensorInfo(dtype, shape)
    if b - a != info.nbytes:
        fail(where, f"data_offsets span {b - a} bytes, its shape and dtype need {info.nbytes}")
    f.tensors[name], f.spans[name] = info, (a, b)


def _no_overlap(f: SafetensorsFile) -> None:
    """Tensors must not share bytes (a crafted header could alias one tensor's data)."""
    end, prev = 0, None
    for name, (a, b) in sorted(f.spans.items(), key=lambda kv: kv[1]):
        if a < end:
            fail(f.url, f"tensors {prev!r:.100} and {name!r:.100} overlap")
        if b > a:
            end, prev = b, name


def read_index(st: Storage) -> dict[str, str]:
    """The weight map of a sharded folder (tensor name -> shard file), checked."""
    url = st.url(INDEX)
    index = read_json(st, INDEX, MAX_HEADER, max_depth=8)
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
        fail(url, "an index must be a JSON object with a weight_map object")
    wmap = index["weight_map"]
    if len(wmap) > MAX_TENSORS:
        fail(url, f"{len(wmap)} tensors: more than {MAX_TENSORS}")
    for name, shard in wmap.items():
        check_name(name, f"{url}: tensor {name!r:.200}")
        check_file_name(shard, f"{url}: shard of {name!r:.200}")
    return wmap


def open_folder(st: Storage) -> tuple[dict[str, SafetensorsFile], dict[str, str]]:
    """(shard files by name, tensor name -> shard): a sharded folder, or one model.safetensors.
    Every tensor of the index must be in its shard, and every tensor of a shard in the index."""
    if not st.exists(INDEX):
        f = open_file(st, SINGLE)
        return {SINGLE: f}, dict.fromkeys(f.tensors, SINGLE)
    wmap = read_index(st)
    files = {rel: open_file(st, rel) for rel in sorted(set(wmap.values()))}
    for name, rel in wmap.items():
        if name not in files[rel].tensors:
            fail(files[rel].url, f"tensor {name!r:.200} of the index is not in this shard")
    for rel, f in files.items():
        extra = sorted(n for n in f.tensors if wmap.get(n) != rel)
        if extra:
            fail(f.url, f"tensors not in {INDEX}: {', '.join(extra[:10])}")
    return files, wmap


def check_tensor_name(name: str, source_name: str | None = None) -> str:
    """A name a safetensors file can hold: not the header's own `__metadata__` key (the
    tensor's entry replaced the metadata map and no reader could open the file, issue 37),
    non-empty, and UTF-8 (a lone surrogate from a pickled key cannot be written)."""
    shown = repr(name) if source_name in (None, name) else f"{name!r} (from {source_name!r})"
    if name == "__metadata__":
        raise CheckpointError(
            f"tensor {shown:.200} cannot be written to safetensors: the name is the header's "
            "own metadata key; rename it (export_checkpoint's name_map, or re-import it "
            "under another name)"
        )
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise CheckpointError(f"tensor {shown:.200} is not valid UTF-8: rename it") from None
    if not name:
        raise CheckpointError(
            f"an empty tensor name{'' if source_name is None else f' (from {source_name!r})'} cannot be written to safetensors"
        )
    return name


def encode(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> list:
    """A safetensors file as a list of buffers (the header, then each tensor's own bytes), so a
    shard is written without a second copy of it in memory. Tensors follow each other in name
    order from offset 0; the header is padded with spaces to 8 bytes, as safetensors does."""
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    bufs, pos = [], 0
    for name in sorted(tensors):
        check_tensor_name(name)
        t = tensors[name].detach().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
        header[name] = {
            "dtype": NAMES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [pos, pos + len(raw)],
        }
        bufs.append(memoryview(raw) if len(raw) else b"")
        pos += len(raw)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    return [struct.pack("<Q", len(blob)) + blob, *bufs]

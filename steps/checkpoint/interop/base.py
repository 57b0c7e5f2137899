"""What every foreign-format reader shares: the bounds on what a foreign file may declare, the
error a bad file raises (naming it), a tensor's declared shape, and bounded range reads.

A foreign checkpoint is untrusted input: every size, offset, shape, dtype and name read from
one is checked against these bounds before it decides an allocation or a read.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
from ckptflow.steps.checkpoint import dcp_metadata

from ckptflow.core import jsonfile
from ckptflow.core.errors import CheckpointError
from ckptflow.core.manifest import MAX_BYTES, MAX_CHUNKS, MAX_DIMS
from ckptflow.core.storage import Storage
from ckptflow.core.storage_errors import raise_translated

MAX_TENSORS = 1 << 20  # entries one checkpoint may declare
MAX_NAME = 4096  # characters of one tensor or value name
MAX_HEADER = 100 << 20  # a safetensors header (the format's own limit) or an index / .metadata
MAX_VALUE = 64 << 20  # one non-tensor value of a DCP checkpoint
MAX_TORCH_FILE = 64 << 30  # a torch.save file read whole (not memory-mapped)
# A file name inside a checkpoint folder: no separators, no `..`, nothing hidden but .metadata
FILE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}$")

__all__ = ["MAX_BYTES", "MAX_CHUNKS", "MAX_DIMS"]


class ForeignFormatError(CheckpointError):
    """A foreign checkpoint file is malformed, hostile or of a kind we do not read; the
    message names the file and what is wrong."""


@dataclass(frozen=True)
class TensorInfo:
    """A tensor as a source declares it (validated)."""

    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def fail(where: str, what: str):
    raise ForeignFormatError(f"{where}: {what}")


def check_int(v, where: str, lo: int = 0, hi: int = MAX_BYTES) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        fail(where, f"expected an integer in [{lo}, {hi}], got {v!r:.60}")
    return v


def check_name(v, where: str) -> str:
    if not isinstance(v, str) or not v or len(v) > MAX_NAME:
        fail(where, f"a name must be a non-empty string of at most {MAX_NAME} characters")
    return v


def check_shape(shape, where: str, dtype: torch.dtype) -> tuple[int, ...]:
    """A shape of at most MAX_DIMS non-negative dimensions holding at most MAX_BYTES."""
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_DIMS:
        fail(where, f"a shape must be a list of at most {MAX_DIMS} integers")
    dims = tuple(check_int(d, where) for d in shape)
    if math.prod(dims) * dtype.itemsize > MAX_BYTES:
        fail(where, f"shape {list(dims)} is larger than {MAX_BYTES} bytes")
    return dims


def check_dtype(dtype, where: str) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or dtype not in dcp_metadata.DTYPES.values():
        fail(where, f"dtype {dtype!r:.40} is not one ckptflow stores")
    return dtype


def check_file_name(name, where: str) -> str:
    """A plain file name inside the checkpoint's folder (a hostile index cannot name
    `../elsewhere` or an absolute path)."""
    if not isinstance(name, str) or not FILE_RE.match(name) or ".." in name:
        fail(where, f"{name!r:.80} is not a plain file name inside the checkpoint's folder")
    return name


def parse_json(blob: bytes, where: str, **limits):
    """A foreign JSON file (header, index, config) parsed bounded (ckptflow.core.jsonfile);
    a bad one is a ForeignFormatError naming it."""
    try:
        return jsonfile.loads(blob, what=where, **limits)
    except jsonfile.BadJsonFile as exc:
        raise ForeignFormatError(str(exc)) from None


def read_json(st: Storage, rel: str, max_bytes: int, **limits):
    blob = st.read(rel, limit=max_bytes + 1)
    return parse_json(blob, st.url(rel), max_bytes=max_bytes, **limits)


def read_range(st: Storage, rel: str, start: int, end: int) -> bytes:
    """Bytes [start, end) of a file, exactly: a short read means the file is truncated."""
    if end == start:
        return b""
    try:
        blob = st.fs.cat_file(st.path(rel), start=start, end=end)
    except FileNotFoundError:
        raise ForeignFormatError(f"{st.url(rel)}: file is missing") from None
    except Exception as exc:
        raise_translated(exc, st.url(rel))
    if len(blob) != end - start:
        fail(st.url(rel), f"truncated: bytes {start}..{end} asked, {len(blob)} read")
    return blob


def file_size(st: Storage, rel: str) -> int:
    try:
        return st.size(rel)
    except FileNotFoundError:
        raise ForeignFormatError(f"{st.url(rel)}: file is missing") from None
    except Exception as exc:
        raise_translated(exc, st.url(rel))

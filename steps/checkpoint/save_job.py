"""What one save needs (SaveJob, shared by the writer on each rank) and how a write item's raw
bytes are cut into parts: the data side of writer.py, kept apart so each stays small."""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import numpy as np
import torch
from ckptflow.steps.checkpoint.packing import PACK_PART
from ckptflow.steps.checkpoint.reuse import TRUST, ObjectTrust

from ckptflow.core import adaptive
from ckptflow.core.storage import Storage


@dataclass
class BasePart:
    """A part of the in-memory base (full) checkpoint that deltas are taken against."""

    raw: np.ndarray
    record: dict


@dataclass
class SaveJob:
    """Everything one save needs; shared by the writer on each rank."""

    storage: Storage
    step: int
    save_id: str
    root_id: str
    world_size: int
    level: int = 1
    compress: bool | str = "auto"  # True/False force; "auto": per part, where it pays
    policy: adaptive.Policy | None = None  # the root's cost estimates ("auto"; None: as True)
    threads: int = 4
    part_bytes: int = 64 << 20
    pack_bytes: int = PACK_PART  # parts smaller than this share objects (packing.py)
    kind: str = "full"
    base_step: int | None = None
    base: dict = field(default_factory=dict)  # (item key, part index) -> BasePart (delta saves)
    capture_base: dict | None = None  # filled on full saves when deltas will follow
    # (item key, part index) of parts whose delta did not pay: stored full from then on,
    # without delta work (shared across saves by the Checkpointer; AdamW's exp_avg is one)
    never_delta: set = field(default_factory=set)
    prior: dict = field(default_factory=dict)  # raw hash -> part record (deduplication)
    trust: ObjectTrust = TRUST  # which existing objects may be referenced unwritten
    fallbacks: list = field(default_factory=list)  # parent roots' stores (see rootreader)
    sound: dict = field(default_factory=dict)  # object key -> verified/written in this save
    written: set = field(default_factory=set)  # object keys this save wrote (or kept)
    cuts: dict = field(default_factory=dict)  # fqn -> global byte offsets where parts must end
    metadata: dict = field(default_factory=dict)
    raw_bytes: int = 0
    written_bytes: int = 0
    reused_bytes: int = 0
    part_records: list = field(default_factory=list)  # every part this rank referenced
    # every rank checks its own objects and rank 0 commits after DCP's save (commit.py), not
    # the coordinator alone in finish; `commit` is then the marker finish prepared (rank 0)
    together: bool = False
    commit: dict | None = None
    # format 5 (rank_save.py): this rank writes its own manifest, rank 0 the step index
    rank: int = 0
    rank_manifests: bool = False
    rank_record: dict | None = None  # what this rank gathers to rank 0 about its manifest
    rank_header: dict | None = None  # kind, base_step, library of its manifest (the index's)


def raw_view(data) -> tuple[np.ndarray, int]:
    """Raw bytes of a tensor or BytesIO as uint8 numpy, and the byte-group width."""
    if isinstance(data, io.BytesIO):
        return np.frombuffer(data.getbuffer(), dtype=np.uint8), 1
    t = data.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    # A conjugate or negative view holds its values only lazily: its bytes are not them.
    t = t.resolve_conj().resolve_neg().contiguous().reshape(-1)
    width = t.element_size() if t.is_floating_point() else 1
    return t.view(torch.uint8).numpy(), width


def local_cuts(cuts: list[int] | None, item, n: int) -> list[int]:
    """Cut points inside this item from global byte offsets of a tensor (`Checkpointer.inherit`),
    so parts line up with another checkpoint's parts of the same tensor, saved by another
    world size, and deduplicate against them. Only for chunks of whole rows (dim-0 shards)."""
    td = item.tensor_data
    if not cuts or td is None or n == 0:
        return []
    size, offs, sizes = list(td.size), list(item.index.offset), list(td.chunk.sizes)
    if any(offs[1:]) or sizes[1:] != size[1:]:
        return []
    start = offs[0] * (n // max(sizes[0], 1)) if offs else 0
    return [c - start for c in cuts if start < c < start + n]


def part_ranges(n: int, step_: int, cuts: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each part: at most `step_` bytes, ending at every cut point."""
    if n == 0:
        return [(0, 0)]
    out, bounds = [], [0, *sorted(set(cuts)), n]
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        out += [(o, min(o + step_, b)) for o in range(a, b, step_)]
    return out

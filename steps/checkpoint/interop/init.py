"""Start a run from weights saved elsewhere: fill a (possibly sharded) state dict from a
ckptflow step, a DCP folder, a torch.save file or Hugging Face safetensors, and say what was
loaded and what was left as initialised.

Names match as they are, or with the state dict's `model.` prefix dropped (a Hugging Face or
plain `model.state_dict()` file names the model's tensors without it). Keys of the state dict
that the source lacks keep their fresh values; keys of the source that the state dict lacks
are not read; both are listed in the report. Shapes must agree, and dtypes unless `cast`.

Foreign tensors go through DCP's own load planner (`ForeignReader`), so a DTensor target is
filled with just its shard on every rank: resharding comes for free, as for ckptflow steps.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed.checkpoint as dcp
from ckptflow.steps.checkpoint.interop.sources import Source, open_source
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from ckptflow.core.errors import CheckpointError, StateDictMismatch

log = logging.getLogger("ckptflow.checkpoint")
PREFIX = "model."


@dataclass
class InitReport:
    """What a load from another source filled in, and what it left as initialised."""

    source: str
    kind: str
    step: int  # the source's step (0 when it has none)
    loaded: list[str] = field(default_factory=list)  # state dict keys filled from the source
    fresh: list[str] = field(default_factory=list)  # state dict keys the source lacks
    unused: list[str] = field(default_factory=list)  # source keys the state dict lacks
    cast: list[str] = field(default_factory=list)  # "key: from -> to" conversions

    def as_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        def some(keys):
            return ", ".join(keys[:20]) + (f", ... ({len(keys)} in all)" if len(keys) > 20 else "")

        out = [
            f"initialised from {self.kind} checkpoint {self.source}: {len(self.loaded)} "
            f"key(s) loaded, {len(self.fresh)} initialised fresh, {len(self.unused)} unused"
        ]
        if self.fresh:
            out.append(f"  initialised fresh (not in the source): {some(self.fresh)}")
        if self.unused:
            out.append(f"  in the source, not in the state dict: {some(self.unused)}")
        if self.cast:
            out.append(f"  converted: {some(self.cast)}")
        return out


def _match(flat: dict, src: Source) -> dict[str, str]:
    """state dict fqn -> source name, for the keys the source holds."""
    have = set(src.tensors) | set(src.values)
    out = {}
    for fqn in flat:
        if fqn in have:
            out[fqn] = fqn
        elif fqn.startswith(PREFIX) and fqn[len(PREFIX) :] in have:
            out[fqn] = fqn[len(PREFIX) :]
    return out


def _check(flat, src: Source, match: dict, cast: bool, report: InitReport) -> None:
    shapes, dtypes = [], []
    for fqn, name in match.items():
        obj, info = flat[fqn], src.tensors.get(name)
        if not isinstance(obj, torch.Tensor):
            if info is not None:
                shapes.append(f"{fqn}: a value in the state dict, a tensor in the source")
            continue
        if info is None:
            shapes.append(f"{fqn}: a tensor in the state dict, a value in the source")
        elif tuple(obj.shape) != info.shape:
            shapes.append(f"{fqn}: model {list(obj.shape)} vs source {list(info.shape)}")
        elif obj.dtype != info.dtype:
            (report.cast if cast else dtypes).append(f"{fqn}: {info.dtype} -> {obj.dtype}")
    if shapes or dtypes:
        lines = [f"the state dict does not match {src.describe()}:"]
        if shapes:
            lines.append(f"  {len(shapes)} shape mismatch(es): " + "; ".join(shapes[:20]))
        if dtypes:
            lines.append(f"  {len(dtypes)} dtype mismatch(es): " + "; ".join(sorted(dtypes)))
            lines.append("  fix: load with cast=True to convert to the model's dtypes")
        raise StateDictMismatch("\n".join(lines))


class ForeignReader(StorageReader):
    """A DCP StorageReader over a Source: its chunks as DCP metadata, each read once."""

    def __init__(self, src: Source, names: dict[str, str]):
        super().__init__()
        self.src, self.names = src, names  # load key -> source name

    def reset(self, checkpoint_id=None) -> None:
        pass

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return True

    def read_metadata(self, *args, **kwargs) -> Metadata:
        sdm, storage = {}, {}
        for key, name in self.names.items():
            info = self.src.tensors[name]
            chunks = self.src.chunks(name)
            sdm[key] = TensorStorageMetadata(
                properties=TensorProperties(dtype=info.dtype),
                size=torch.Size(info.shape),
                chunks=[ChunkStorageMetadata(torch.Size(o), torch.Size(s)) for o, s in chunks],
            )
            for o, _ in chunks:
                storage[MetadataIndex(key, torch.Size(o))] = (name, tuple(o))
        return Metadata(state_dict_metadata=sdm, storage_data=storage)

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs) -> None:
        self.storage = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        by_chunk: dict = {}
        for ri in plan.items:
            by_chunk.setdefault(ri.storage_index, []).append(ri)
        for idx, items in by_chunk.items():
            name, offsets = self.storage[idx]
            chunk = self.src.read_chunk(name, offsets)  # read once, dropped after its items
            for ri in items:
                part = chunk
                for d, (o, n) in enumerate(zip(ri.storage_offsets, ri.lengths, strict=True)):
                    part = part.narrow(d, o, n)
                dst = planner.resolve_tensor(ri).detach()
                dst.copy_(part)
                planner.commit_tensor(ri, dst)
        fut: Future = Future()
        fut.set_result(None)
        return fut


def _load_foreign(ck, src: Source, state_dict: dict, flat, mappings, match: dict) -> None:
    tensors = {k: flat[k] for k, n in match.items() if n in src.tensors}
    if tensors:
        dcp.load(
            tensors,
            storage_reader=ForeignReader(src, {k: match[k] for k in tensors}),
            planner=DefaultLoadPlanner(),
            process_group=ck._group(background=False),
            no_dist=not ck._distributed,
        )
    for k, n in match.items():
        if n in src.values:
            set_element(state_dict, mappings[k], src.read_value(n))


def load_from(ck, state_dict: dict, source: str, *, step: int | None = None, cast=False):
    """Fill `state_dict` in place from `source` (collective when `ck` is distributed); the
    InitReport. `ck` is the Checkpointer whose process group and options are used."""
    src = open_source(source, step, process_group=ck._group(background=False))
    flat, mappings = flatten_state_dict(state_dict)
    match = _match(flat, src)
    report = InitReport(src.uri, src.kind, src.step or 0)
    if not match:
        raise CheckpointError(
            f"no key of the state dict is in {src.describe()} (state dict: "
            f"{', '.join(sorted(flat)[:5])}; source: {', '.join(sorted(src.tensors)[:5])}); "
            "check the source, or map the names first (ckptflow ckpt import, then load)"
        )
    _check(flat, src, match, cast, report)
    report.loaded = sorted(match)
    report.fresh = sorted(set(flat) - set(match))
    report.unused = sorted((set(src.tensors) | set(src.values)) - set(match.values()))
    if src.kind == "ckptflow":
        part = {match[k]: flat[k] for k in match}  # keyed by the source's names
        src.ck.load(part, step=src.step, cast=cast)
        for k in match:
            if not isinstance(flat[k], torch.Tensor):
                set_element(state_dict, mappings[k], part[match[k]])
        src.close()
    else:
        _load_foreign(ck, src, state_dict, flat, mappings, match)
    for line in report.lines():
        log.info("%s", line)
    return report

"""Import a checkpoint made elsewhere as an ordinary ckptflow step.

The source (DCP folder, torch.save file, Hugging Face safetensors, or another ckptflow root) is
read through its validating reader, then saved by the Checkpointer like any training save:
checksummed, compressed, deduplicated against the root, committed by the commit protocol. The
step then loads bitwise equal to the source, resharded to any world size, and every tool
(`ckpt ls`, `verify`, `gc`, `archive`) treats it as its own.

    ckptflow ckpt import /data/dcp/step-1000 --to /runs/r1/ckpt --step 1000
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from ckptflow.steps.checkpoint.interop import structure
from ckptflow.steps.checkpoint.interop.sources import Source, nest, open_source

from ckptflow.core.errors import CheckpointError


@dataclass(frozen=True)
class ImportReport:
    """What an import read and wrote."""

    source: str  # the source's URI
    kind: str  # dcp | torch | hf | ckptflow
    root: str  # the ckptflow root written
    step: int  # the step committed there
    tensors: int
    values: int
    logical_bytes: int  # tensor bytes read from the source
    written_bytes: int  # new stored bytes (after compression and deduplication)
    seconds: float

    def as_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        return [
            f"imported {self.kind} checkpoint {self.source}",
            f"  as step {self.step} under {self.root}: {self.tensors} tensors, {self.values} "
            f"values, {self.logical_bytes} bytes ({self.written_bytes} new stored bytes) "
            f"in {self.seconds:.2f}s",
        ]


def _metadata(src: Source) -> dict:
    meta = {"imported_from": {"uri": src.uri, "kind": src.kind}}
    if src.kind == "ckptflow":  # a copy between roots keeps what the step said of itself
        meta = {**(src.manifest.get("metadata") or {}), **meta}
        meta["imported_from"]["step"] = src.step
    elif src.model_config:
        meta["hf_config"] = src.model_config
    if src.kind == "torch" and src.structure:  # an export as torch gives it back
        meta[structure.KEY] = src.structure
    return meta


def import_checkpoint(
    source: str, root: str, *, step: int | None = None, src_step: int | None = None, **ck_options
) -> ImportReport:
    """Read `source` and save it as `step` (default: the source's own step, else 0) under the
    ckptflow root `root`. `ck_options` go to the Checkpointer (compression_level, part_mib,
    ...). One process: the whole state is held in memory for the save."""
    from ckptflow.steps.checkpoint import Checkpointer

    t0 = time.perf_counter()
    src = open_source(source, src_step)
    target = step if step is not None else (src.step if src.step is not None else 0)
    names = sorted(src.tensors) + sorted(src.values)
    if not names:
        raise CheckpointError(f"{src.uri} holds no tensors and no values: nothing to import")
    flat = src.read_many(names)
    # the object as it was saved where its structure is known (an empty dict in a list decides
    # how DCP names the list's entries: nesting by paths alone would drop it and rename them)
    state = structure.rebuild(src.structure, flat, src.uri) if src.structure else None
    state = nest(flat, src.paths) if state is None else state
    with Checkpointer(root, **ck_options) as ck:
        if target in ck.committed_steps():
            raise CheckpointError(
                f"step {target} is already committed under {ck.root}; import with --step N "
                "of a step not there yet, or into another root"
            )
        ck.save(target, state, metadata=_metadata(src))
        stats = ck.last_save
    if src.kind == "ckptflow":
        src.close()
    return ImportReport(
        source=src.uri,
        kind=src.kind,
        root=ck.root,
        step=target,
        tensors=len(src.tensors),
        values=len(src.values),
        logical_bytes=sum(i.nbytes for i in src.tensors.values()),
        written_bytes=stats.bytes_written,
        seconds=time.perf_counter() - t0,
    )

"""Export a checkpoint to the formats serving and training stacks read: Hugging Face
safetensors (sharded by a size limit, with `model.safetensors.index.json` and `config.json`),
a plain DCP folder that stock `torch.distributed.checkpoint.load` reads, or one torch.save file.

Streaming: tensors are planned into shards from the manifest alone, then each shard is read
from the source, converted, written and dropped before the next, so peak memory stays near
one shard, not the model (the torch.save format is one file, so it holds everything: use it
for small models).

    ckptflow ckpt export /runs/r1/ckpt --format hf --to /out/hf --dtype bf16 --model-only
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from ckptflow.steps.checkpoint.interop import dcp_writer, structure
from ckptflow.steps.checkpoint.interop import safetensors_io as sft
from ckptflow.steps.checkpoint.interop.shards import DTYPES
from ckptflow.steps.checkpoint.interop.shards import file_record as _file
from ckptflow.steps.checkpoint.interop.shards import out_dtype as _out_dtype
from ckptflow.steps.checkpoint.interop.shards import read_shard as _read_shard
from ckptflow.steps.checkpoint.interop.sources import Source, nest, open_source

from ckptflow import env
from ckptflow.core.errors import CheckpointError

FORMATS = ("hf", "dcp", "torch")
DEFAULT_SHARD_BYTES = 5 * 10**9  # Hugging Face's own default max_shard_size ("5GB")
TORCH_FILE = "model.pt"
MODEL_PREFIX = "model."  # the model's part of a training state saved by ckptflow's steps


@dataclass(frozen=True)
class ExportReport:
    """Where an export went and what it holds."""

    uri: str  # the export folder
    format: str  # hf | dcp | torch
    source: str  # the checkpoint exported (a step's URI)
    step: int | None
    files: list[dict] = field(default_factory=list)  # [{name, bytes, sha256, tensors}]
    tensors: int = 0
    values: int = 0
    bytes: int = 0  # tensor bytes written
    dtype: str = ""  # fp32 | bf16 | "" (as stored)
    dropped: list[str] = field(default_factory=list)  # values a format cannot hold
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        out = [
            f"exported {self.source} as {self.format} to {self.uri}: {self.tensors} tensors, "
            f"{self.values} values, {self.bytes} bytes in {len(self.files)} file(s), "
            f"{self.seconds:.2f}s"
        ]
        if self.dropped:
            out.append(
                f"  not exported ({self.format} holds tensors only): {len(self.dropped)} "
                f"value(s): {', '.join(self.dropped[:10])}"
            )
        return out


def select_names(
    src: Source, fmt: str, model_only: bool, name_map: Callable[[str], str | None] | None
) -> tuple[dict[str, str], list[str]]:
    """(exported name -> source name, source values left out). `model_only` keeps the
    `model.` part of a training state (names without the prefix) and drops values; `name_map`
    renames each (None drops it)."""
    names = sorted(src.tensors) + ([] if fmt == "hf" or model_only else sorted(src.values))
    dropped = sorted(src.values) if fmt == "hf" and not model_only else []
    if model_only and any(n.startswith(MODEL_PREFIX) for n in src.tensors):
        names = [n for n in names if n.startswith(MODEL_PREFIX)]
    out: dict[str, str] = {}
    for n in names:
        new = n.removeprefix(MODEL_PREFIX) if model_only else n
        new = name_map(new) if name_map else new
        if new is None:
            continue
        if new in out:
            raise CheckpointError(f"export names {out[new]!r} and {n!r} both as {new!r}")
        out[new] = n
    if not out:
        raise CheckpointError(f"{src.uri}: nothing to export (no tensor selected)")
    return out, dropped


def plan_shards(src: Source, names: dict[str, str], dtype: str | None, limit: int) -> list:
    """Consecutive groups of exported names whose output bytes stay under `limit` (a larger
    tensor has a shard of its own), planned from the declared shapes: nothing is read."""
    shards, cur, size = [], [], 0
    for new, old in names.items():
        info = src.tensors.get(old)
        n = (
            0
            if info is None
            else info.nbytes // info.dtype.itemsize * _out_dtype(info.dtype, dtype).itemsize
        )
        if cur and size + n > limit:
            shards.append(cur)
            cur, size = [], 0
        cur.append(new)
        size += n
    return [*shards, cur] if cur else shards


def _write_hf(src, dest, names, shards, dtype, info) -> list[dict]:
    meta = {
        "format": "pt",
        **{k: v if isinstance(v, str) else json.dumps(v) for k, v in (info or {}).items()},
    }
    if src.kind == "ckptflow" and src.model_config:
        meta["model_config"] = json.dumps(src.model_config, sort_keys=True)
    if dtype:
        meta["dtype"] = dtype
    files, wmap, total = [], {}, 0
    for i, shard in enumerate(shards, 1):
        rel = sft.SINGLE if len(shards) == 1 else f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        tensors = _read_shard(src, names, shard, dtype)
        bufs = sft.encode(tensors, meta)  # the tensors' own memory: no second copy
        dest.write(rel, bufs)
        files.append(_file(rel, bufs, len(tensors)))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        wmap.update(dict.fromkeys(tensors, rel))
        del tensors, bufs  # one shard at a time
    index = {"metadata": {"total_size": total}, "weight_map": wmap}
    dest.write(sft.INDEX, json.dumps(index, indent=1, sort_keys=True).encode())
    config = _config(src, dtype, info)
    if config is not None:
        dest.write(
            "config.json", json.dumps(config, indent=1, sort_keys=True, default=str).encode()
        )
    return files


def _config(src: Source, dtype: str | None, info: dict | None) -> dict | None:
    """config.json: the model config where it is known (a ckptflow model's, or the HF
    config the source came with)."""
    if src.kind == "ckptflow" and src.model_config:
        extra = {"dtype": dtype} if dtype else {}
        return {"model_type": "ckptflow-gpt", **src.model_config, **extra, **(info or {})}
    hf = (
        src.model_config
        if src.kind == "hf"
        else (
            (src.manifest.get("metadata") or {}).get("hf_config")
            if src.kind == "ckptflow"
            else None
        )
    )
    return dict(hf) if isinstance(hf, dict) else None


def _write_torch(src, dest, names, dtype) -> list[dict]:
    import io

    state = _read_shard(src, names, list(names), dtype)
    nested = None
    if src.structure and all(n == o for n, o in names.items()):  # the containers as saved
        nested = structure.rebuild(src.structure, state, src.uri)
    if nested is None:  # renamed, a part, or no record: DCP's naming (keys as strings)
        nested = nest(
            state, {n: src.paths[o] for n, o in names.items() if n == o and o in src.paths}
        )
    buf = io.BytesIO()
    torch.save(nested, buf)
    blob = buf.getvalue()
    dest.write(TORCH_FILE, blob)
    return [_file(TORCH_FILE, blob, sum(isinstance(v, torch.Tensor) for v in state.values()))]


def export_checkpoint(
    root: str,
    to: str,
    *,
    step: int | None = None,
    fmt: str = "hf",
    dtype: str | None = None,
    model_only: bool = False,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    name_map: Callable[[str], str | None] | None = None,
    info: dict | None = None,
) -> ExportReport:
    """Export step `step` (None: the newest valid) of `root` (a ckptflow root; any source
    open_source reads works) to `to` in `fmt`. `dtype` converts floating tensors; `info`
    (str -> str) goes into the files' metadata and config.json."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if dtype not in (None, *DTYPES):
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if not isinstance(shard_bytes, int) or shard_bytes < 1:
        raise ValueError(f"shard_bytes must be a positive integer, got {shard_bytes!r}")
    t0 = time.perf_counter()
    src = open_source(root, step)
    names, dropped = select_names(src, fmt, model_only, name_map)
    dest = env.open_storage(to)
    if fmt == "torch":
        files = _write_torch(src, dest, names, dtype)
    else:
        shards = plan_shards(src, names, dtype, shard_bytes)
        writer = _write_hf if fmt == "hf" else dcp_writer.write
        files = writer(src, dest, names, shards, dtype, info)
    if src.kind == "ckptflow":
        src.close()
    tensors = [n for n, old in names.items() if old in src.tensors]
    return ExportReport(
        uri=dest.url(),
        format=fmt,
        source=src.uri,
        step=src.step,
        files=files,
        tensors=len(tensors),
        values=len(names) - len(tensors),
        bytes=sum(
            src.tensors[names[n]].nbytes
            // src.tensors[names[n]].dtype.itemsize
            * _out_dtype(src.tensors[names[n]].dtype, dtype).itemsize
            for n in tensors
        ),
        dtype=dtype or "",
        dropped=dropped,
        seconds=time.perf_counter() - t0,
    )

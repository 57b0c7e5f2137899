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
from ckptflow.steps.checkpoint.interop import dcp_writer, export_folder, structure
from ckptflow.steps.checkpoint.interop import safetensors_io as sft
from ckptflow.steps.checkpoint.interop.shards import DTYPES
from ckptflow.steps.checkpoint.interop.shards import file_record as _file
from ckptflow.steps.checkpoint.interop.shards import out_dtype as _out_dtype
from ckptflow.steps.checkpoint.interop.shards import read_shard as _read_shard
from ckptflow.steps.checkpoint.interop.sources import Source, nest, open_source

from ckptflow import env
from ckptflow.core.errors import CheckpointError
from ckptflow.core.storage import Storage

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
    left_out: int = 0  # tensors not exported (outside the model, or dropped by name_map)
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
        if self.left_out:
            out.append(
                f"  not exported: {self.left_out} tensor(s) outside the model or renamed away "
                "(--full-state exports the whole training state)"
            )
        return out


def select_names(
    src: Source, fmt: str, model_only: bool, name_map: Callable[[str], str | None] | None
) -> tuple[dict[str, str], list[str]]:
    """(exported name -> source name, source values left out). `model_only` keeps the
    `model.` part of a training state (names without the prefix) and drops values; `name_map`
    renames each (None drops it)."""
    names = sorted(src.tensors) + ([] if fmt == "hf" or model_only else sorted(src.values))
    part = model_only and any(n.startswith(MODEL_PREFIX) for n in src.tensors)
    # values of the model's part, or of a state with no model part, that hf cannot hold
    dropped = sorted(src.values) if fmt == "hf" and not part else []
    if part:
        names = [n for n in names if n.startswith(MODEL_PREFIX)]
    out: dict[str, str] = {}
    for n in names:
        new = n.removeprefix(MODEL_PREFIX) if model_only else n
        new = name_map(new) if name_map else new
        if new is None:
            continue
        if new in out:
            raise CheckpointError(f"export names {out[new]!r} and {n!r} both as {new!r}")
        if fmt == "hf":
            sft.check_tensor_name(new, n)
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
    """Shards, then config.json and the index; a single `model.safetensors` (the name
    transformers opens first) goes last, so a crash midway leaves no way in to a part."""
    meta = {
        "format": "pt",
        **{k: v if isinstance(v, str) else json.dumps(v) for k, v in (info or {}).items()},
    }
    if src.kind == "ckptflow" and src.model_config:
        meta["model_config"] = json.dumps(src.model_config, sort_keys=True)
    if dtype:
        meta["dtype"] = dtype
    files, wmap, total, last = [], {}, 0, None
    for rel, shard in zip(hf_files(len(shards)), shards, strict=True):
        tensors = _read_shard(src, names, shard, dtype)
        bufs = sft.encode(tensors, meta)  # the tensors' own memory: no second copy
        if rel == sft.SINGLE:
            last = bufs  # one shard: held until the index and config are written
        else:
            dest.write(rel, bufs)
        files.append(_file(rel, bufs, len(tensors)))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        wmap.update(dict.fromkeys(tensors, rel))
        del tensors, bufs  # one shard at a time
    config = _config(src, dtype, info)
    if config is not None:
        dest.write(
            "config.json", json.dumps(config, indent=1, sort_keys=True, default=str).encode()
        )
    index = {"metadata": {"total_size": total}, "weight_map": wmap}
    dest.write(sft.INDEX, json.dumps(index, indent=1, sort_keys=True).encode())
    if last is not None:
        dest.write(sft.SINGLE, last)
    return files


def hf_files(n: int) -> list[str]:
    """The shard files of an export in `n` shards, named as Hugging Face names them."""
    return (
        [sft.SINGLE]
        if n == 1
        else [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    )


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
    model_only: bool | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    name_map: Callable[[str], str | None] | None = None,
    info: dict | None = None,
    storage: Storage | None = None,
) -> ExportReport:
    """Export step `step` (None: the newest valid) of `root` (a ckptflow root; any source
    open_source reads works) to the folder `to` in `fmt`. `model_only` (default: for `hf`
    only, the format serving stacks load) keeps the model's tensors; `dtype` converts floating
    tensors; `info` (str -> str) goes into the files' metadata and config.json. `storage`:
    the folder `to` (default: opened from the URI). The folder must be new, empty or an
    earlier export (interop.export_folder); it then holds this export alone."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if dtype not in (None, *DTYPES):
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if not isinstance(shard_bytes, int) or shard_bytes < 1:
        raise ValueError(f"shard_bytes must be a positive integer, got {shard_bytes!r}")
    t0 = time.perf_counter()
    model_only = fmt == "hf" if model_only is None else model_only
    dest = storage or env.open_storage(to)
    src = open_source(root, step)
    try:
        export_folder.check_apart(dest, src.location)
        names, dropped = select_names(src, fmt, model_only, name_map)
        if fmt == "torch":
            export_folder.claim(dest, src.location, fmt, [TORCH_FILE])
            files = _write_torch(src, dest, names, dtype)
        else:
            shards = plan_shards(src, names, dtype, shard_bytes)
            planned = hf_files(len(shards)) if fmt == "hf" else dcp_writer.data_files(len(shards))
            export_folder.claim(dest, src.location, fmt, planned)
            writer = _write_hf if fmt == "hf" else dcp_writer.write
            files = writer(src, dest, names, shards, dtype, info)
    finally:
        if src.kind == "ckptflow":
            src.close()
    tensors = [n for n, old in names.items() if old in src.tensors]
    report = ExportReport(
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
        left_out=len(src.tensors) - len(tensors),
        seconds=time.perf_counter() - t0,
    )
    written = [f["name"] for f in files] + [
        a for a in export_folder.AUXILIARY[fmt] if dest.exists(a)
    ]
    about = {"source": src.uri, "step": src.step, "tensors": report.tensors}
    export_folder.finish(dest, fmt, written, about)
    return report

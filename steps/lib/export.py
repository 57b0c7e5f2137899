"""Export a checkpoint's model weights to safetensors, readable by `safetensors` alone.

The export folder holds `model.safetensors` (fp32 or bf16 tensors named as in the model's
state dict, the model config and the source checkpoint in the file's own metadata) and
`config.json` beside it (the same config, for tools that look there). `export_step` streams a
committed step through the engine's Hugging Face exporter (interop.exporter): a model larger
than the shard limit becomes `model-0000K-of-0000N.safetensors` files, and
`model.safetensors.index.json` maps every tensor to its file:

    from safetensors import safe_open
    with safe_open("model.safetensors", "pt") as f:
        config = json.loads(f.metadata()["model_config"])
        weights = {k: f.get_tensor(k) for k in f.keys()}
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

import torch
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.checkpoint.interop import export_folder
from ckptflow.steps.checkpoint.interop.exporter import DEFAULT_SHARD_BYTES, export_checkpoint
from ckptflow.steps.checkpoint.interop.safetensors_io import INDEX, check_tensor_name
from ckptflow.steps.lib.model import GPT, ModelConfig
from safetensors.torch import save as st_save

from ckptflow import env

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
WEIGHTS, CONFIG = "model.safetensors", "config.json"


@dataclass(frozen=True)
class Exported:
    """Where an export went and what it holds."""

    uri: str  # the export folder
    weights_uri: str  # its model.safetensors (sharded: model.safetensors.index.json)
    sha256: str  # of model.safetensors (sharded: of the shards' sha256s, in order)
    bytes: int  # size of model.safetensors (sharded: of all shards)
    dtype: str  # fp32 | bf16
    tensors: int  # number of tensors

    def as_dict(self) -> dict:
        return asdict(self)


def load_model_weights(ckpt_uri: str, step: int) -> tuple[dict[str, torch.Tensor], dict]:
    """The model tensors of a committed step (fp32, one process, every byte verified) and the
    manifest's metadata. Works for fine-tune roots too (objects borrowed from the base)."""
    ck = Checkpointer(ckpt_uri)
    meta = ck.manifest(step)["metadata"]
    if "model_config" not in meta:
        raise ValueError(
            f"step {step} under {ckpt_uri} has no model_config: not a model checkpoint"
        )
    model = GPT(ModelConfig.from_dict(meta["model_config"]))
    state = {"model": model.state_dict()}
    ck.load(state, step=step)
    ck.close()
    return {k: v.detach().contiguous() for k, v in state["model"].items()}, meta


def export_step(
    ckpt_uri: str,
    step: int,
    dest_uri: str,
    *,
    dtype: str = "fp32",
    info: dict | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> Exported:
    """The model weights of a committed step exported under `dest_uri`, one shard in memory at
    a time (every byte verified as it is read; fine-tune roots read borrowed objects too)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    rep = export_checkpoint(
        ckpt_uri,
        dest_uri,
        step=step,
        fmt="hf",
        dtype=dtype,
        model_only=True,
        info=info,
        shard_bytes=shard_bytes,
    )
    one = len(rep.files) == 1
    digest = (  # several shards: the digest of their digests, in file order
        rep.files[0]["sha256"]
        if one
        else hashlib.sha256("".join(f["sha256"] for f in rep.files).encode()).hexdigest()
    )
    dest = env.open_storage(dest_uri)
    return Exported(
        uri=rep.uri,
        weights_uri=dest.url(WEIGHTS if one else INDEX),
        sha256=digest,
        bytes=sum(f["bytes"] for f in rep.files),
        dtype=dtype,
        tensors=rep.tensors,
    )


def export_weights(
    tensors: dict[str, torch.Tensor],
    model_config: dict,
    dest_uri: str,
    *,
    dtype: str = "fp32",
    info: dict | None = None,
) -> Exported:
    """Write `model.safetensors` and `config.json` under `dest_uri` (any storage URI): a new or
    empty folder, or an earlier export, which this one replaces (interop.export_folder)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    for name in tensors:
        check_tensor_name(name)
    cast = {k: t.to(DTYPES[dtype]).contiguous() for k, t in sorted(tensors.items())}
    meta = {
        "format": "pt",
        "model_config": json.dumps(model_config, sort_keys=True),
        "dtype": dtype,
        **{k: v if isinstance(v, str) else json.dumps(v) for k, v in (info or {}).items()},
    }
    blob = st_save(cast, metadata=meta)
    dest = env.open_storage(dest_uri)
    export_folder.claim(dest, None, "hf", [WEIGHTS])
    config = {"model_type": "ckptflow-gpt", **model_config, "dtype": dtype, **(info or {})}
    dest.write(CONFIG, json.dumps(config, indent=1, sort_keys=True, default=str).encode())
    dest.write(WEIGHTS, blob)  # the entry point last: a crash leaves no half export to load
    export_folder.finish(dest, "hf", [WEIGHTS, CONFIG], {"tensors": len(cast)})
    return Exported(
        uri=dest.url(),
        weights_uri=dest.url(WEIGHTS),
        sha256=hashlib.sha256(blob).hexdigest(),
        bytes=len(blob),
        dtype=dtype,
        tensors=len(cast),
    )

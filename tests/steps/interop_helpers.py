"""Sources made by each format's own writer, for the interop tests."""

from __future__ import annotations

import json
import struct

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

from tests.steps import distworkers as dw

EXTRA = {"step": 7, "sched": {"last_epoch": 7, "lrs": [0.1, 0.05]}, "data": (3, 1024)}


def trained_state() -> tuple[dict, dict]:
    """A one-process Net + AdamW state (plain tensors) with EXTRA, and its full reference."""
    model, opt = dw.build(False, seed=0)
    dw.train(model, opt, 3)
    state = {**dw.sharded_state(model, opt), "extra": EXTRA}
    return state, dw.full_state(model, opt)


def dcp_folder(path: str) -> dict:
    """A DCP checkpoint written by stock dcp.save; returns the reference full state."""
    state, ref = trained_state()
    dcp.save(state, checkpoint_id=path, no_dist=True)
    return ref


def model_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "emb.weight": torch.randn(11, 13, generator=g),
        "l1.weight": torch.randn(7, 13, generator=g),
        "l1.bias": torch.randn(7, generator=g),
        "l2.weight": torch.randn(5, 7, generator=g).bfloat16(),
        "l2.bias": torch.randn(5, generator=g).bfloat16(),
        "ids": torch.arange(9, dtype=torch.int64),
    }


def hf_sharded(folder, tensors: dict, per_shard: int = 2) -> None:
    """A sharded HF folder as transformers writes it: shard files and the index."""
    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    groups = [names[i : i + per_shard] for i in range(0, len(names), per_shard)]
    wmap = {}
    for i, group in enumerate(groups, 1):
        rel = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        save_file({n: tensors[n] for n in group}, str(folder / rel), metadata={"format": "pt"})
        wmap.update(dict.fromkeys(group, rel))
    index = {"metadata": {"total_size": 0}, "weight_map": wmap}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def raw_safetensors(path, header: dict | bytes, data: bytes = b"", length: int | None = None):
    """A safetensors file from a (possibly hostile) header and data, written by hand."""
    blob = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(blob) if length is None else length
    path.write_bytes(struct.pack("<Q", n) + blob + data)


def tensor_bytes(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes, for bitwise comparison (NaN payloads and -0.0 included)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def assert_same_structure(got, want, where: str = "state") -> None:
    """Same types all the way down (int keys stay ints, tuples stay tuples), keys in order,
    tensors bitwise, floats by repr (NaN equals NaN); AssertionError naming the path."""
    assert type(got) is type(want), (where, type(got), type(want))
    if isinstance(want, dict):
        assert list(got) == list(want), (where, list(got), list(want))
        for k in want:
            assert_same_structure(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert_same_structure(a, b, f"{where}[{i}]")
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, where
        assert torch.equal(tensor_bytes(got), tensor_bytes(want)), where
    elif isinstance(want, float):
        assert repr(got) == repr(want), (where, got, want)
    else:
        assert got == want, (where, got, want)

"""Safetensors export: readable by `safetensors` alone, config inside and beside, fp32 and bf16."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from ckptflow.steps.lib.export import CONFIG, WEIGHTS, export_weights
from ckptflow.steps.lib.model import GPT, config_for
from safetensors import safe_open
from safetensors.numpy import load_file


@pytest.fixture
def model():
    torch.manual_seed(0)
    return GPT(config_for("tiny", seq_len=16))


def test_fp32_export_reads_back_with_safetensors_and_numpy_only(tmp_path, model):
    sd = model.state_dict()
    ex = export_weights(
        sd,
        model.cfg.to_dict(),
        str(tmp_path / "exp"),
        dtype="fp32",
        info={"source_checkpoint": "/r/ckpt/step-00000008", "step": 8},
    )
    path = tmp_path / "exp" / WEIGHTS
    assert ex.weights_uri == str(path) and ex.tensors == len(sd) and ex.bytes == path.stat().st_size
    assert ex.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    arrays = load_file(str(path))  # numpy: no torch, no ckptflow
    assert set(arrays) == set(sd)
    for k, t in sd.items():
        assert arrays[k].dtype == np.float32 and np.array_equal(arrays[k], t.numpy()), k
    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata()
    assert json.loads(meta["model_config"]) == model.cfg.to_dict()
    assert meta["dtype"] == "fp32" and meta["source_checkpoint"] == "/r/ckpt/step-00000008"
    assert meta["step"] == "8"
    beside = json.loads(Path(tmp_path / "exp" / CONFIG).read_text())
    assert beside["n_layer"] == model.cfg.n_layer and beside["dtype"] == "fp32"


def test_bf16_export_is_the_rounded_weights(tmp_path, model):
    sd = model.state_dict()
    export_weights(sd, model.cfg.to_dict(), str(tmp_path), dtype="bf16")
    with safe_open(str(tmp_path / WEIGHTS), framework="pt") as f:
        for k, t in sd.items():
            got = f.get_tensor(k)
            assert got.dtype == torch.bfloat16 and torch.equal(got, t.to(torch.bfloat16)), k
    # half the bytes of fp32 (plus the same small header)
    assert (tmp_path / WEIGHTS).stat().st_size < 0.6 * sum(t.numel() * 4 for t in sd.values())


def test_unknown_dtype_is_refused(tmp_path, model):
    with pytest.raises(ValueError, match="fp32, bf16"):
        export_weights(model.state_dict(), {}, str(tmp_path), dtype="fp8")


@pytest.mark.s3
def test_export_to_s3(s3_bucket, model):
    import boto3
    from safetensors.torch import load

    sd = model.state_dict()
    ex = export_weights(sd, model.cfg.to_dict(), f"s3://{s3_bucket}/run/export/v1", dtype="fp32")
    assert ex.weights_uri == f"s3://{s3_bucket}/run/export/v1/{WEIGHTS}"
    s3 = boto3.client("s3")
    blob = s3.get_object(Bucket=s3_bucket, Key=f"run/export/v1/{WEIGHTS}")["Body"].read()
    got = load(blob)
    assert all(torch.equal(got[k], t) for k, t in sd.items())
    cfg = json.loads(s3.get_object(Bucket=s3_bucket, Key=f"run/export/v1/{CONFIG}")["Body"].read())
    assert cfg["d_model"] == model.cfg.d_model


def test_export_step_streams_shards_with_an_index(tmp_path, model):
    from ckptflow.steps.checkpoint import Checkpointer
    from ckptflow.steps.lib.export import export_step

    sd = model.state_dict()
    with Checkpointer(str(tmp_path / "ckpt")) as ck:
        ck.save(6, {"model": sd, "step": 6}, metadata={"model_config": model.cfg.to_dict()})
    ex = export_step(
        str(tmp_path / "ckpt"), 6, str(tmp_path / "exp"), dtype="bf16", shard_bytes=64 << 10
    )
    index = json.loads(Path(tmp_path / "exp" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and ex.weights_uri.endswith("model.safetensors.index.json")
    assert ex.tensors == len(sd) and ex.bytes == sum(
        (tmp_path / "exp" / f).stat().st_size for f in files
    )
    got = {}
    for f in files:
        with safe_open(str(tmp_path / "exp" / f), framework="pt") as h:
            assert json.loads(h.metadata()["model_config"]) == model.cfg.to_dict()
            got.update({k: h.get_tensor(k) for k in h.keys()})  # noqa: SIM118 - safe_open is no dict
    assert set(got) == set(sd)
    assert all(torch.equal(got[k], t.to(torch.bfloat16)) for k, t in sd.items())


def test_a_tensor_named_like_the_safetensors_metadata_is_refused(tmp_path, model):
    """Issue 37 defect 5: `__metadata__` would replace the header's metadata map and no
    reader could open the file; refused, nothing written."""
    sd = {**model.state_dict(), "__metadata__": torch.ones(2)}
    from ckptflow.core.errors import CheckpointError

    with pytest.raises(CheckpointError, match="__metadata__"):
        export_weights(sd, model.cfg.to_dict(), str(tmp_path / "exp"))
    assert not (tmp_path / "exp" / WEIGHTS).exists()


def test_export_weights_over_a_sharded_export_leaves_one_checkpoint(tmp_path, model):
    """Issue 37 defect 3: an earlier export's shards and index must not stay beside the new
    model.safetensors (a loader reading the index would get the old step)."""
    from ckptflow.steps.checkpoint import Checkpointer
    from ckptflow.steps.lib.export import export_step

    sd = model.state_dict()
    with Checkpointer(str(tmp_path / "ckpt")) as ck:
        ck.save(6, {"model": sd}, metadata={"model_config": model.cfg.to_dict()})
    export_step(str(tmp_path / "ckpt"), 6, str(tmp_path / "exp"), shard_bytes=64 << 10)
    new = {k: t + 1 for k, t in sd.items()}
    export_weights(new, model.cfg.to_dict(), str(tmp_path / "exp"))
    names = {p.name for p in (tmp_path / "exp").iterdir()}
    assert names == {WEIGHTS, CONFIG, "ckptflow-export.json"}
    got = load_file(str(tmp_path / "exp" / WEIGHTS))
    assert all(np.array_equal(got[k], t.numpy()) for k, t in new.items())

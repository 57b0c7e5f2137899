"""Hugging Face safetensors in and out: one file or sharded with its index, imported bitwise;
hostile headers and indexes refused naming the file; exports sharded by a size limit with an
index and config.json, read by `safetensors` alone, and HF -> ckptflow -> HF bitwise."""

from __future__ import annotations

import json

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.checkpoint.interop import (
    ForeignFormatError,
    export_checkpoint,
    import_checkpoint,
    open_source,
)
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from tests.steps.interop_helpers import hf_sharded, model_tensors, raw_safetensors


def _load_hf(folder) -> dict[str, torch.Tensor]:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    out = {}
    for rel in sorted(set(index["weight_map"].values())):
        out.update(load_file(str(folder / rel)))
    assert set(out) == set(index["weight_map"])
    return out


def _equal(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for k in b:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def _template(tensors: dict, prefix: str = "") -> dict:
    return {f"{prefix}{k}": torch.zeros_like(v) for k, v in tensors.items()}


def test_single_file_imports_bitwise(tmp_path):
    ref = model_tensors()
    save_file(ref, str(tmp_path / "w.safetensors"))
    rep = import_checkpoint(str(tmp_path / "w.safetensors"), str(tmp_path / "ckpt"))
    assert rep.kind == "hf" and rep.tensors == len(ref) and rep.step == 0
    got = _template(ref)
    Checkpointer(str(tmp_path / "ckpt")).load(got, step=0)
    _equal(got, ref)


def test_hf_sharded_to_ckptflow_to_hf_sharded_is_bitwise(tmp_path):
    ref = model_tensors()
    hf_sharded(tmp_path / "hf", ref, per_shard=2)
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": "toy", "n": 3}))
    root = str(tmp_path / "ckpt")
    import_checkpoint(str(tmp_path / "hf"), root, step=12)
    rep = export_checkpoint(root, str(tmp_path / "out"), fmt="hf", shard_bytes=400)
    assert len(rep.files) >= 3 and rep.step == 12
    assert all(f["name"].endswith(f"-of-{len(rep.files):05d}.safetensors") for f in rep.files)
    _equal(_load_hf(tmp_path / "out"), ref)
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == {
        "model_type": "toy",
        "n": 3,
    }


def test_export_bf16_model_only_with_a_name_map(tmp_path):
    ref = model_tensors()
    ck = Checkpointer(str(tmp_path / "ckpt"))
    ck.save(4, {"model": ref, "optim": {"m": torch.ones(3)}, "step": 4})
    rep = export_checkpoint(
        str(tmp_path / "ckpt"),
        str(tmp_path / "out"),
        fmt="hf",
        dtype="bf16",
        model_only=True,
        name_map=lambda n: None if n == "ids" else f"transformer.{n}",
    )
    got = load_file(str(tmp_path / "out" / "model.safetensors"))  # one shard: HF's own name
    assert set(got) == {f"transformer.{k}" for k in ref if k != "ids"}
    for k, v in ref.items():
        if k != "ids":
            assert got[f"transformer.{k}"].dtype == torch.bfloat16
            assert torch.equal(got[f"transformer.{k}"], v.to(torch.bfloat16)), k
    assert rep.dropped == [] and rep.tensors == len(ref) - 1
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {"model.safetensors"}


def test_hf_export_names_the_values_it_cannot_hold(tmp_path):
    Checkpointer(str(tmp_path / "ckpt")).save(1, {"w": torch.ones(2), "step": 1})
    rep = export_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "out"), fmt="hf")
    assert rep.dropped == ["step"] and "not exported" in "\n".join(rep.lines())


GOOD = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}


@pytest.mark.parametrize(
    ("header", "data", "length", "message"),
    [
        ({"a": GOOD}, b"\0" * 16, 1 << 40, "header length"),
        ({"a": GOOD}, b"\0" * 16, 1 << 20, "header length"),
        ({"a": {**GOOD, "data_offsets": [0, 1 << 30]}}, b"\0" * 16, None, "expected an integer"),
        ({"a": {**GOOD, "data_offsets": [8, 4]}}, b"\0" * 16, None, "span"),
        ({"a": {**GOOD, "data_offsets": [0, 12]}}, b"\0" * 16, None, "need 16"),
        ({"a": {**GOOD, "dtype": "F128"}}, b"\0" * 16, None, "not one of"),
        ({"a": {**GOOD, "dtype": ["F32"]}}, b"\0" * 16, None, "not one of"),
        ({"a": {**GOOD, "shape": [-1, 4]}}, b"\0" * 16, None, "expected an integer"),
        ({"a": {**GOOD, "shape": [1 << 40, 1 << 40]}}, b"", None, "larger than"),
        ({"a": GOOD, "b": {**GOOD, "data_offsets": [8, 24]}}, b"\0" * 24, None, "overlap"),
        ({"a": {**GOOD, "extra": 1}}, b"\0" * 16, None, "exactly dtype"),
        ({"__metadata__": {"k": 5}}, b"", None, "__metadata__"),
        (b"[1, 2]", b"", None, "not a JSON object"),
        (b"{" * 100 + b"}" * 100, b"", None, "nested deeper"),
        (b"not json", b"", None, "not JSON"),
    ],
)
def test_hostile_safetensors_headers_are_refused(tmp_path, header, data, length, message):
    path = tmp_path / "bad.safetensors"
    raw_safetensors(path, header, data, length)
    with pytest.raises(ForeignFormatError, match=message) as ei:
        import_checkpoint(str(path), str(tmp_path / "ckpt"))
    assert str(path) in str(ei.value)
    assert not (tmp_path / "ckpt").exists()


def test_short_file_is_refused(tmp_path):
    (tmp_path / "x.safetensors").write_bytes(b"\1\2")
    with pytest.raises(ForeignFormatError, match="too short"):
        open_source(str(tmp_path / "x.safetensors"))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda wm: {**wm, "l1.bias": "../../etc/passwd"}, "not a plain file name"),
        (lambda wm: {**wm, "l1.bias": "/abs.safetensors"}, "not a plain file name"),
        (lambda wm: {**wm, "ghost": next(iter(wm.values()))}, "is not in this shard"),
        (lambda wm: {k: v for k, v in list(wm.items())[1:]}, "not in model.safetensors.index"),
        (lambda wm: {**wm, "l1.bias": 7}, "not a plain file name"),
    ],
)
def test_hostile_index_is_refused(tmp_path, edit, message):
    hf_sharded(tmp_path / "hf", model_tensors(), per_shard=2)
    path = tmp_path / "hf" / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    index["weight_map"] = edit(index["weight_map"])
    path.write_text(json.dumps(index))
    with pytest.raises(ForeignFormatError, match=message):
        open_source(str(tmp_path / "hf"))


def test_a_truncated_shard_is_refused_when_read(tmp_path):
    hf_sharded(tmp_path / "hf", model_tensors(), per_shard=2)
    shard = sorted((tmp_path / "hf").glob("model-*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-4])
    with pytest.raises(ForeignFormatError, match="expected an integer|truncated"):
        import_checkpoint(str(tmp_path / "hf"), str(tmp_path / "ckpt"))


def test_export_metadata_and_config_of_a_ckptflow_model(tmp_path):
    ref = model_tensors()
    cfg = {"n_layer": 2, "d_model": 13}
    Checkpointer(str(tmp_path / "ckpt")).save(2, {"model": ref}, metadata={"model_config": cfg})
    export_checkpoint(
        str(tmp_path / "ckpt"),
        str(tmp_path / "out"),
        fmt="hf",
        model_only=True,
        info={"source_step": "2"},
    )
    with safe_open(str(tmp_path / "out" / "model.safetensors"), framework="pt") as f:
        meta = f.metadata()
    assert json.loads(meta["model_config"]) == cfg and meta["source_step"] == "2"
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "ckptflow-gpt" and config["d_model"] == 13


@pytest.mark.s3
def test_import_from_and_export_to_s3(tmp_path, s3_bucket):
    import boto3

    ref = model_tensors()
    hf_sharded(tmp_path / "hf", ref, per_shard=2)
    s3 = boto3.client("s3")
    for f in (tmp_path / "hf").iterdir():
        s3.put_object(Bucket=s3_bucket, Key=f"in/hf/{f.name}", Body=f.read_bytes())
    root = f"s3://{s3_bucket}/runs/r1/ckpt"
    rep = import_checkpoint(f"s3://{s3_bucket}/in/hf", root, step=1)
    assert rep.kind == "hf" and rep.tensors == len(ref)
    out = export_checkpoint(root, f"s3://{s3_bucket}/out/hf", fmt="hf", shard_bytes=400)
    from safetensors.torch import load

    got = {}
    for f in out.files:
        body = s3.get_object(Bucket=s3_bucket, Key=f"out/hf/{f['name']}")["Body"].read()
        got.update(load(body))
    _equal(got, ref)


MEMORY_PROBE = """
import shutil, sys
from ckptflow.steps.checkpoint.interop import export_checkpoint
def kib(field):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(field + ":"))
open("/proc/self/clear_refs", "w").write("5")
base = kib("VmRSS")
export_checkpoint(sys.argv[1], sys.argv[2], fmt=sys.argv[3], shard_bytes=16 << 20)
print((kib("VmHWM") - base) // 1024)
"""


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["hf", "dcp"])
def test_export_memory_follows_the_shard_not_the_model(tmp_path, fmt):
    """A 384 MiB model exported in 16 MiB shards grows the exporter's peak RSS by a few
    shards, far from the model (a whole-model export would need at least 384 MiB more)."""
    import subprocess
    import sys

    g = torch.Generator().manual_seed(0)
    sd = {f"model.w{i}": torch.randn(1024, 1024, generator=g) for i in range(96)}
    with Checkpointer(str(tmp_path / "ckpt")) as ck:
        ck.save(1, sd)
    del sd
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, str(tmp_path / "ckpt"), str(tmp_path / "out"), fmt],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    growth_mib = int(out.stdout.strip().splitlines()[-1])
    assert growth_mib < 192, f"export grew the peak RSS by {growth_mib} MiB"

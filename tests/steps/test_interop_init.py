"""Starting from elsewhere: `Checkpointer.load(state, source=URI)` fills what the source holds
(resharded onto FSDP2 ranks), leaves the rest as initialised, and says which is which."""

from __future__ import annotations

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer
from safetensors.torch import save_file

from ckptflow.core.errors import CheckpointError, StateDictMismatch
from tests.steps import distworkers as dw
from tests.steps import interop_workers as iw
from tests.steps.interop_helpers import model_tensors


def _net_tensors(seed=3) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {k: v.clone() for k, v in dw.Net().state_dict().items()}


def test_init_from_hf_reports_loaded_fresh_and_unused(tmp_path):
    src = {**_net_tensors(), "lm_head.weight": torch.ones(2, 2)}
    del src["l2.bias"]
    save_file(src, str(tmp_path / "w.safetensors"))
    state = {"model": {k: torch.zeros_like(v) for k, v in _net_tensors().items()}, "step": 0}
    ck = Checkpointer(str(tmp_path / "ckpt"))
    assert ck.load(state, source=str(tmp_path / "w.safetensors")) == 0
    rep = ck.last_init
    assert rep.kind == "hf" and rep.fresh == ["model.l2.bias", "step"]
    assert rep.unused == ["lm_head.weight"] and len(rep.loaded) == 4
    for k, v in src.items():
        if k != "lm_head.weight":
            assert torch.equal(state["model"][k], v), k
    assert torch.equal(state["model"]["l2.bias"], torch.zeros(5))  # left as it was
    text = "\n".join(rep.lines())
    assert "initialised fresh (not in the source): model.l2.bias, step" in text
    assert ck.committed_steps() == []  # nothing was written to this root


def test_init_from_a_ckptflow_step_and_a_torch_file(tmp_path):
    ref = _net_tensors()
    Checkpointer(str(tmp_path / "other")).save(9, {"model": ref, "step": 9})
    state = {"model": {k: torch.zeros_like(v) for k, v in ref.items()}, "step": 0}
    ck = Checkpointer(str(tmp_path / "ckpt"))
    assert ck.load(state, source=str(tmp_path / "other")) == 9
    assert state["step"] == 9 and all(torch.equal(state["model"][k], ref[k]) for k in ref)
    torch.save({"model": ref}, tmp_path / "m.pt")
    state = {"model": {k: torch.zeros_like(v) for k, v in ref.items()}}
    ck.load(state, source=str(tmp_path / "m.pt"))
    assert ck.last_init.kind == "torch" and not ck.last_init.fresh
    assert all(torch.equal(state["model"][k], ref[k]) for k in ref)


def test_shape_and_dtype_mismatches_are_refused_unless_cast(tmp_path):
    src = model_tensors()
    save_file(src, str(tmp_path / "w.safetensors"))
    ck = Checkpointer(str(tmp_path / "ckpt"))
    bad = {"l1.weight": torch.zeros(7, 12)}
    with pytest.raises(StateDictMismatch, match=r"l1.weight: model \[7, 12\] vs source \[7, 13\]"):
        ck.load(bad, source=str(tmp_path / "w.safetensors"))
    fp32 = {"l2.weight": torch.zeros(5, 7)}  # bf16 in the source
    with pytest.raises(StateDictMismatch, match="cast=True"):
        ck.load(fp32, source=str(tmp_path / "w.safetensors"))
    ck.load(fp32, source=str(tmp_path / "w.safetensors"), cast=True)
    assert torch.equal(fp32["l2.weight"], src["l2.weight"].float())
    assert ck.last_init.cast == ["l2.weight: torch.bfloat16 -> torch.float32"]
    with pytest.raises(CheckpointError, match="no key of the state dict"):
        ck.load({"nope": torch.zeros(1)}, source=str(tmp_path / "w.safetensors"))


def test_fsdp_ranks_init_from_hf_and_one_process_from_a_chunked_dcp(tmp_path):
    src = _net_tensors(seed=4)
    save_file(src, str(tmp_path / "w.safetensors"))
    out = str(tmp_path / "out.pt")
    dcp_dir = str(tmp_path / "dcp")
    dw.spawn(2, iw.dcp_save_and_init_worker, dcp_dir, str(tmp_path / "w.safetensors"), out)
    res = torch.load(out)
    for k, v in src.items():
        assert torch.equal(res["state"][f"model.{k}"], v), k
    assert res["report"]["fresh"] == [] and res["report"]["kind"] == "hf"
    # the DCP folder holds each tensor in one chunk per rank: assembled on load
    ref = torch.load(f"{out}.ref")
    model, opt = dw.build(False, seed=7)
    dw.train(model, opt, 1)
    state = dw.sharded_state(model, opt)
    ck = Checkpointer(str(tmp_path / "ckpt"))
    ck.load(state, source=dcp_dir)
    assert ck.last_init.kind == "dcp" and not ck.last_init.fresh
    for k, v in state["model"].items():
        assert torch.equal(v, ref[f"model.{k}"]), k

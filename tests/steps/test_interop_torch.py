"""torch.save files in and out: loaded weights-only (a planted payload is refused and never
runs), nested state dicts imported bitwise, and exported back as one torch.save file."""

from __future__ import annotations

import os

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.checkpoint.interop import (
    ForeignFormatError,
    export_checkpoint,
    import_checkpoint,
)

from tests.steps import distworkers as dw
from tests.steps.interop_helpers import trained_state


class Planted:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_planted_payload_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "created-by-the-payload"
    torch.save({"w": torch.ones(2), "evil": Planted(str(marker))}, tmp_path / "evil.pt")
    with pytest.raises(ForeignFormatError, match="not a weights-only torch.save file"):
        import_checkpoint(str(tmp_path / "evil.pt"), str(tmp_path / "ckpt"))
    assert not marker.exists()


def test_a_pickled_module_is_refused_with_the_fix(tmp_path):
    torch.save(dw.Net(), tmp_path / "net.pt")
    with pytest.raises(ForeignFormatError, match=r"model.state_dict\(\)"):
        import_checkpoint(str(tmp_path / "net.pt"), str(tmp_path / "ckpt"))


def test_torch_save_to_ckptflow_to_torch_save_is_bitwise(tmp_path):
    state, ref = trained_state()
    torch.save(state, tmp_path / "src.pt")
    root = str(tmp_path / "ckpt")
    rep = import_checkpoint(str(tmp_path / "src.pt"), root, step=3)
    assert rep.kind == "torch" and rep.step == 3
    model, opt = dw.build(False, seed=9)
    dw.train(model, opt, 1)
    target = {**dw.sharded_state(model, opt), "extra": dw.extra_template()}
    Checkpointer(root).load(target, step=3)
    assert target["extra"] == state["extra"]
    from torch.distributed.checkpoint.state_dict import set_state_dict

    set_state_dict(model, opt, model_state_dict=target["model"], optim_state_dict=target["optim"])
    got = dw.full_state(model, opt)
    assert set(got) == set(ref) and all(torch.equal(got[k], ref[k]) for k in ref)
    export_checkpoint(root, str(tmp_path / "out"), fmt="torch")
    back = torch.load(tmp_path / "out" / "model.pt", weights_only=True)
    assert set(back) == {"model", "optim", "extra"}
    for k, v in state["model"].items():
        assert torch.equal(back["model"][k], v), k
    assert back["extra"] == state["extra"]
    assert back["optim"]["param_groups"][0]["lr"] == state["optim"]["param_groups"][0]["lr"]


class Sub(torch.Tensor):
    """A tensor subclass (a DTensor is one): the file must hold plain tensors."""


def test_a_tensor_subclass_in_a_torch_file_is_refused(tmp_path):
    torch.save({"w": torch.ones(2).as_subclass(Sub)}, tmp_path / "sub.pt")
    with pytest.raises(ForeignFormatError, match="save plain tensors|weights-only"):
        import_checkpoint(str(tmp_path / "sub.pt"), str(tmp_path / "ckpt"))

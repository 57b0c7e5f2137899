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
from tests.steps.interop_helpers import assert_same_structure, trained_state


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


def _adam_state() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 4)).square().sum().backward()
        opt.step()
    return model, opt


def test_an_optimizer_state_dict_round_trips_with_its_adam_moments(tmp_path):
    """Issue 37 defect 1: an optimizer's `state` is keyed by int; import -> export torch
    must give those ints back, so load_state_dict gives each parameter its moments."""
    model, opt = _adam_state()
    src = {"model": model.state_dict(), "optim": opt.state_dict()}
    torch.save(src, tmp_path / "src.pt")
    root = str(tmp_path / "ckpt")
    import_checkpoint(str(tmp_path / "src.pt"), root, step=3)
    export_checkpoint(root, str(tmp_path / "out"), fmt="torch")
    back = torch.load(tmp_path / "out" / "model.pt", weights_only=True)
    assert list(back["optim"]["state"]) == [0, 1, 2, 3]
    fresh_model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    fresh = torch.optim.Adam(fresh_model.parameters(), lr=0.5)
    fresh_model.load_state_dict(back["model"])
    fresh.load_state_dict(back["optim"])
    for p_old, p_new in zip(model.parameters(), fresh_model.parameters(), strict=True):
        old, new = opt.state[p_old], fresh.state[p_new]
        assert set(new) == {"step", "exp_avg", "exp_avg_sq"}
        for k in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(new[k], old[k]), k
    assert fresh.param_groups[0]["lr"] == 0.01
    assert_same_structure(back["optim"], src["optim"])


def test_int_keys_empty_containers_and_tuples_keep_their_structure(tmp_path):
    src = {
        "state": {},  # an optimizer before its first step
        "ints": {0: torch.ones(2), 7: {"x": torch.zeros(1)}, -3: 1.5},
        "empty_list": [],
        "nested_empty": {"a": {}, "b": [torch.ones(1), {}]},
        "pair": (1, "two"),
        "lrs": [0.1, 0.2],
        "none": None,
    }
    torch.save(src, tmp_path / "src.pt")
    root = str(tmp_path / "ckpt")
    import_checkpoint(str(tmp_path / "src.pt"), root, step=1)
    export_checkpoint(root, str(tmp_path / "out"), fmt="torch")
    assert_same_structure(torch.load(tmp_path / "out" / "model.pt", weights_only=True), src)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.eye(3).to_sparse(),
        lambda: torch.eye(3).to_sparse_csr(),
        lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
    ],
    ids=["coo", "csr", "nested"],
)
def test_sparse_and_nested_tensors_are_refused_naming_file_and_key(tmp_path, make, capsys):
    """Issue 37 defect 10: a refusal naming the file and the key, exit 2 (was a RuntimeError)."""
    from ckptflow.cli import main

    torch.save({"w": torch.ones(2), "odd": {"t": make()}}, tmp_path / "odd.pt")
    with pytest.raises(ForeignFormatError, match=r"odd\.pt.*odd\.t"):
        import_checkpoint(str(tmp_path / "odd.pt"), str(tmp_path / "ckpt"))
    argv = ["ckpt", "import", str(tmp_path / "odd.pt"), "--to", str(tmp_path / "ckpt")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "odd.pt" in err and "odd.t" in err and len(err.strip().splitlines()) == 1


def test_a_dict_key_neither_str_nor_int_is_refused_naming_it(tmp_path):
    """DCP names a key by str(key): True would come back as "True"; refused, not changed."""
    torch.save({"w": torch.ones(2), "flags": {True: 1}}, tmp_path / "k.pt")
    with pytest.raises(ForeignFormatError, match=r"k\.pt.*True.*bool"):
        import_checkpoint(str(tmp_path / "k.pt"), str(tmp_path / "ckpt"))

"""The benchmark's child side: every method family's save and load run through the entry point
that benchmarks/checkpoint.py starts once per phase, on a tiny state (in process)."""

import json
import os

import pytest
import torch

from benchmarks import checkpoint_methods as cm
from benchmarks import llm_state


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The parent's work folder: the generated state and its meta.json."""
    work = tmp_path_factory.mktemp("bench-work")
    meta = llm_state.make_state(1 << 20, os.path.join(work, "state.safetensors"), warm_steps=1)
    with open(os.path.join(work, "meta.json"), "w") as f:
        json.dump(meta, f)
    return str(work)


def _save_spec(work: str, method: str, name: str) -> dict:
    """What benchmarks/checkpoint.py passes a save phase (fp32, 2 writer threads)."""
    return {
        "phase": "save",
        "method": method,
        "dtype": "fp32",
        "path": os.path.join(work, name),
        "work": work,
        "expect": os.path.join(work, f"expect-{name}.json"),
        "threads": 2,
        "torch_threads": 1,
        "raw_bytes": 1 << 20,
    }


@pytest.fixture(autouse=True)
def _torch_threads():
    """The child's main sets torch's thread count for its process: this one's is put back."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _run(spec: dict, capsys) -> dict:
    assert cm.main([json.dumps(spec)]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("RESULT ")]
    assert len(lines) == 1
    return json.loads(lines[0][len("RESULT ") :])


@pytest.mark.parametrize("method", ["dcp", "ckptflow-sync", "safetensors"])
def test_a_method_saves_and_loads_the_state_bitwise(work, method, capsys):
    spec = _save_spec(work, method, method)
    saved = _run(spec, capsys)
    assert saved["save_s"] > 0 and saved["stored_bytes"] > 0
    assert saved["raw_bytes"] == llm_state.nbytes(llm_state.load_state(work, "fp32")[1])
    # the load compares every tensor's digest with the saved state's (else SystemExit)
    loaded = _run(spec | {"phase": "load", "step": saved.get("step"), "cache": "warm"}, capsys)
    assert loaded["load_s"] > 0 and loaded["cold"] is False


def test_the_incremental_method_reports_its_entropy_floor(work, capsys):
    spec = _save_spec(work, "ckptflow-incremental", "inc")
    out = _run(spec, capsys)
    assert out["kind"] == "delta"
    assert 0 < out["entropy_floor"] <= out["ratio_vs_full"] <= 1.0


def test_a_damaged_load_is_refused(work, capsys):
    """The check that gives every load figure its meaning: a load that differs is an error."""
    spec = _save_spec(work, "ckptflow-sync", "damaged")
    saved = _run(spec, capsys)
    with open(spec["expect"]) as f:
        expect = json.load(f)
    name = sorted(expect["digests"])[0]
    expect["digests"][name] = "0" * 32
    with open(spec["expect"], "w") as f:
        json.dump(expect, f)
    with pytest.raises(SystemExit, match="differs from the saved one"):
        cm.main([json.dumps(spec | {"phase": "load", "step": saved["step"], "cache": "warm"})])

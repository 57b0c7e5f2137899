"""The benchmarks' state: what they save must be what a training process saves."""

import os

import torch
from safetensors.torch import save_file

from benchmarks import llm_state


def test_the_state_to_save_is_resident_memory_not_a_view_of_its_file(tmp_path):
    """A training state lives in the process's own memory. Tensors viewing a mapping of the
    state file (safetensors' load_file) made every save also read the state back from the
    disk after a cold load's page-cache drop: saves and async stalls timed that disk read."""
    path = os.path.join(tmp_path, "state.safetensors")
    want = {"model.w": torch.arange(4096, dtype=torch.float32), "optim.s": torch.ones(3, 5)}
    save_file(want, path)
    sd32, sd = llm_state.load_state(str(tmp_path), "fp32")
    # Rewritten in place, same size: a tensor still mapping the file would see the zeros.
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.write(bytes(size))
    for got in (sd32, sd):
        assert set(got) == set(want)
        for k, v in want.items():
            assert torch.equal(got[k], v), k

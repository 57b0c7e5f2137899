"""The benchmark's own set-up: what it saves must be what a training process saves."""

import os

import torch
from safetensors.torch import save_file

from benchmarks import checkpoint_methods as cm


def test_the_state_to_save_is_resident_memory_not_a_view_of_its_file(tmp_path):
    """A training state lives in the process's own memory. Tensors viewing a mapping of the
    state file (safetensors' load_file) made every save also read the state back from the
    disk after a cold load's page-cache drop: saves and async stalls timed that disk read."""
    path = os.path.join(tmp_path, "state.safetensors")
    want = {"model.w": torch.arange(4096, dtype=torch.float32), "optim.s": torch.ones(3, 5)}
    save_file(want, path)
    sd32, sd = cm.load_state(str(tmp_path), "fp32")
    # Rewritten in place, same size: a tensor still mapping the file would see the zeros.
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.write(bytes(size))
    for got in (sd32, sd):
        assert set(got) == set(want)
        for k, v in want.items():
            assert torch.equal(got[k], v), k


def test_the_compressed_share_is_what_the_save_chose(tmp_path):
    from ckptflow.steps.checkpoint import Checkpointer

    sd = {"w": torch.randn(512, 1024), "b": torch.randn(16)}
    for compress, want in ((True, 1.0), (False, 0.0)):
        ck = Checkpointer(str(tmp_path / str(compress)), threads=2, compress=compress)
        ck.save(1, sd).wait()
        assert cm.compressed_share(ck.manifest(1)) == want
        ck.save(2, sd).wait()  # every part reused: nothing written, nothing chosen
        assert cm.compressed_share(ck.manifest(2)) is None
        ck.close()

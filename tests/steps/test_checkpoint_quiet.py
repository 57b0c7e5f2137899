"""A single-process save or load says nothing torch need not say (issue 38, point 10)."""

from __future__ import annotations

import warnings

import torch
from ckptflow.steps.checkpoint import Checkpointer


def test_single_process_save_and_load_raise_no_torch_distributed_warning(tmp_path):
    """DCP warns "torch.distributed is disabled ... assuming the intent is to save in a single
    process" on every call without a process group, even when told no_dist=True: every export
    and select printed it. The engine's intent is known; other warnings still show."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ck = Checkpointer(str(tmp_path / "ckpt"))
        ck.save(1, {"w": torch.ones(4), "lr": 0.1})
        target = {"w": torch.zeros(4), "lr": 0.0}
        assert ck.load(target) == 1
        ck.close()
        warnings.warn("a caller's own warning", UserWarning, stacklevel=1)
    said = [str(w.message) for w in seen]
    assert not [s for s in said if "torch.distributed is disabled" in s], said
    assert "a caller's own warning" in said  # nothing else is hidden
    assert torch.equal(target["w"], torch.ones(4))

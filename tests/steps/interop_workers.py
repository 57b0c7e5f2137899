"""Rank workers of the interop tests (spawned: module-level functions)."""

from __future__ import annotations

import torch

from tests.steps import distworkers as dw


def init_from_worker(rank, world, source, out_path):
    """FSDP2 ranks initialise the Net's weights from a foreign file; rank 0 saves the full
    model state and the report."""
    from ckptflow.steps.checkpoint import Checkpointer
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    model, opt = dw.build(True, seed=99)
    state = {"model": get_model_state_dict(model)}
    ck = Checkpointer(f"memory://unused-{rank}")
    ck.load(state, source=source)
    set_model_state_dict(model, state["model"])
    got = dw.full_state(model, opt)
    if rank == 0:
        torch.save({"state": got, "report": ck.last_init.as_dict()}, out_path)
    ck.close()


def dcp_save_and_init_worker(rank, world, dcp_dir, source, out_path):
    """Stock dcp.save of an FSDP2 Net (chunked over the ranks), then init_from_worker."""
    import torch.distributed.checkpoint as dcp

    model, opt = dw.build(True, seed=0)
    dw.train(model, opt, 2)
    dcp.save(dw.sharded_state(model, opt), checkpoint_id=dcp_dir)
    ref = dw.full_state(model, opt)
    if rank == 0:
        torch.save(ref, f"{out_path}.ref")
    init_from_worker(rank, world, source, out_path)

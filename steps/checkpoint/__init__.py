"""ckptflow's checkpoint engine (see docs/format.md).

    from ckptflow.steps.checkpoint import Checkpointer
    ck = Checkpointer("s3://bucket/runs/r1/ckpt")   # or a local path
    ck.save(step, state_dict)                       # collective: every rank calls it
    step = ck.load(state_dict, step=None)           # None = latest valid; fills state_dict in place

Names are imported lazily, so torch-free modules of this package (retention, planner) can be
used without importing torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Checkpointer": "ckptflow.steps.checkpoint.checkpointer",
    "LoadInfo": "ckptflow.steps.checkpoint.results",
    "SaveHandle": "ckptflow.steps.checkpoint.results",
    "SaveStats": "ckptflow.steps.checkpoint.results",
    "CheckpointError": "ckptflow.core.errors",
    "CorruptCheckpoint": "ckptflow.core.errors",
    "StateDictMismatch": "ckptflow.core.errors",
    "Storage": "ckptflow.core.storage",
    "StorageError": "ckptflow.core.storage",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'ckptflow.steps.checkpoint' has no attribute {name!r}")

"""ckptflow's checkpoint engine (see docs/format.md).

    from steps.checkpoint import Checkpointer
    ck = Checkpointer("s3://bucket/runs/r1/ckpt")   # or a local path
    ck.save(step, state_dict)                       # collective: every rank calls it
    step = ck.load(state_dict, step=None)           # None = latest valid; fills state_dict in place

Names are imported lazily, so torch-free modules of this package (retention, planner) can be
used without importing torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Checkpointer": "steps.checkpoint.checkpointer",
    "LoadInfo": "steps.checkpoint.checkpointer",
    "SaveHandle": "steps.checkpoint.checkpointer",
    "SaveStats": "steps.checkpoint.checkpointer",
    "CheckpointError": "steps.checkpoint.errors",
    "CorruptCheckpoint": "steps.checkpoint.errors",
    "StateDictMismatch": "steps.checkpoint.errors",
    "Storage": "steps.checkpoint.storage",
    "StorageError": "steps.checkpoint.storage",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'steps.checkpoint' has no attribute {name!r}")

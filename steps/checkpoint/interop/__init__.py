"""Meet checkpoints where they are: read DCP folders, torch.save files and Hugging Face
safetensors (every field bounded and validated: these files may be hostile), import them as
ordinary ckptflow steps, export ckptflow steps to those formats, and initialise a run from any
of them (`Checkpointer.load(..., source=URI)`).

    from ckptflow.steps.checkpoint.interop import import_checkpoint, export_checkpoint
    import_checkpoint("/data/dcp-run/step-1000", "/runs/r1/ckpt")      # -> an ImportReport
    export_checkpoint("/runs/r1/ckpt", "/out/hf", fmt="hf", dtype="bf16", model_only=True)

Names are imported lazily: `ckptflow ckpt` imports this package (and torch) only for the
import and export commands.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "open_source": "ckptflow.steps.checkpoint.interop.sources",
    "import_checkpoint": "ckptflow.steps.checkpoint.interop.importer",
    "ImportReport": "ckptflow.steps.checkpoint.interop.importer",
    "export_checkpoint": "ckptflow.steps.checkpoint.interop.exporter",
    "ExportReport": "ckptflow.steps.checkpoint.interop.exporter",
    "load_from": "ckptflow.steps.checkpoint.interop.init",
    "InitReport": "ckptflow.steps.checkpoint.interop.init",
    "ForeignFormatError": "ckptflow.steps.checkpoint.interop.base",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

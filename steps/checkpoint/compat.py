"""Check a state dict against a checkpoint before loading, listing every difference."""

from __future__ import annotations

import torch
from torch.distributed.checkpoint._nested_dict import flatten_state_dict

from ckptflow.core.errors import StateDictMismatch


def check_compatible(state_dict: dict, manifest: dict, root: str, step: int) -> None:
    """Raise StateDictMismatch listing missing keys and shape differences (extra keys are fine)."""
    flat, _ = flatten_state_dict(state_dict)
    tensors, values = manifest["tensors"], set(manifest["values"])
    missing, shapes = [], []
    for fqn, obj in flat.items():
        if isinstance(obj, torch.Tensor):
            if fqn not in tensors:
                missing.append(fqn)
            elif list(obj.shape) != tensors[fqn]["size"]:
                shapes.append(
                    f"{fqn}: model {list(obj.shape)} vs checkpoint {tensors[fqn]['size']}"
                )
        elif fqn not in values and fqn not in tensors:
            missing.append(fqn)
    if not (missing or shapes):
        return
    lines = [f"the state dict does not match checkpoint step {step} under {root}:"]
    if missing:
        lines.append(
            f"  {len(missing)} key(s) not in the checkpoint: {', '.join(sorted(missing)[:20])}"
        )
    if shapes:
        lines.append(f"  {len(shapes)} shape mismatch(es): " + "; ".join(shapes[:20]))
    extra = sorted((set(tensors) | values) - set(flat))
    if extra:
        lines.append(f"  (checkpoint keys not requested: {', '.join(extra[:10])})")
    lines.append(
        "  fix: build the model with the same configuration as the saved run, or load a "
        "matching checkpoint"
    )
    raise StateDictMismatch("\n".join(lines))

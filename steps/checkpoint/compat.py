"""Check a state dict against a checkpoint before loading, listing every difference."""

from __future__ import annotations

import torch
from torch.distributed.checkpoint._nested_dict import flatten_state_dict

from ckptflow.core.errors import StateDictMismatch


def check_compatible(
    state_dict: dict, manifest: dict, root: str, step: int, *, cast: bool = False
) -> None:
    """Raise StateDictMismatch listing missing keys, shape and dtype differences (extra keys
    are fine). A dtype difference is one unless `cast`: loading float64 into float16 gives
    inf, float into bool gives True, so a conversion happens only when asked for."""
    flat, _ = flatten_state_dict(state_dict)
    tensors, values = manifest["tensors"], set(manifest["values"])
    missing, shapes, dtypes = [], [], []
    for fqn, obj in flat.items():
        if isinstance(obj, torch.Tensor):
            if fqn not in tensors:
                missing.append(fqn)
                continue
            if list(obj.shape) != tensors[fqn]["size"]:
                shapes.append(
                    f"{fqn}: model {list(obj.shape)} vs checkpoint {tensors[fqn]['size']}"
                )
            target = str(obj.dtype).removeprefix("torch.")
            if not cast and target != tensors[fqn]["dtype"]:
                dtypes.append(f"{fqn}: checkpoint {tensors[fqn]['dtype']}, model {target}")
        elif fqn not in values and fqn not in tensors:
            missing.append(fqn)
    if not (missing or shapes or dtypes):
        return
    lines = [f"the state dict does not match checkpoint step {step} under {root}:"]
    if missing:
        lines.append(
            f"  {len(missing)} key(s) not in the checkpoint: {', '.join(sorted(missing)[:20])}"
        )
    if shapes:
        lines.append(f"  {len(shapes)} shape mismatch(es): " + "; ".join(shapes[:20]))
    if dtypes:  # every one: a partial list would hide which tensors a cast would change
        lines.append(f"  {len(dtypes)} dtype mismatch(es): " + "; ".join(sorted(dtypes)))
    extra = sorted((set(tensors) | values) - set(flat))
    if extra:
        lines.append(f"  (checkpoint keys not requested: {', '.join(extra[:10])})")
    lines.append(
        "  fix: build the model with the same configuration as the saved run, or load a "
        "matching checkpoint"
        + ("; to convert to the model's dtypes, load with cast=True" if dtypes else "")
    )
    raise StateDictMismatch("\n".join(lines))

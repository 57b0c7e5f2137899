"""Check what a caller hands the engine before anything is read or written: options and step
numbers against what the format can hold, a state dict to save against what can be stored, a
state dict to load into against the checkpoint (listing every difference)."""

from __future__ import annotations

import torch
from ckptflow.steps.checkpoint import dcp_metadata
from torch.distributed.checkpoint._nested_dict import flatten_state_dict

from ckptflow.core import layout
from ckptflow.core.errors import CheckpointError, StateDictMismatch

# Checkpointer options: (lowest, highest). part_mib=0 cut a 16 KiB tensor into 4,096 objects.
OPTION_RANGES = {
    "full_every": (1, 1 << 20),
    "compression_level": (-(1 << 17), 22),  # zstd's range (negative levels are faster)
    "threads": (1, 1024),
    "part_mib": (1, 1 << 16),
    "pack_kib": (0, 1 << 10),  # a pack holds parts under 1 MiB at most (manifest.MAX_PACK)
}


def check_options(**options) -> None:
    """ValueError naming the option that is not an integer within OPTION_RANGES."""
    for name, value in options.items():
        lo, hi = OPTION_RANGES[name]
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value!r:.40}")


def check_step(step) -> int:
    """The step, when it is one a manifest can carry (every reader refuses others)."""
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= layout.MAX_STEP:
        raise ValueError(f"step must be an integer in [0, 2**62], got {step!r:.40}")
    return step


def _unsavable(t: torch.Tensor) -> str | None:
    local = getattr(t, "_local_tensor", t)  # a DTensor's data is its local shard
    if t.is_sparse or t.layout != torch.strided or local.layout != torch.strided:
        return f"a {t.layout} tensor; store it dense (.to_dense())"
    if local.device.type == "meta":
        return "a meta tensor holds no data; materialise it first"
    name = str(t.dtype).removeprefix("torch.")
    if name not in dcp_metadata.DTYPES:
        return f"dtype {name} is not supported ({', '.join(dcp_metadata.DTYPES)}); convert it first"
    return None


def check_savable(state_dict: dict) -> None:
    """CheckpointError naming every tensor that cannot be stored, before anything is written."""
    flat, _ = flatten_state_dict(state_dict)
    bad = [
        f"{fqn!r}: {why}"
        for fqn, obj in flat.items()
        if isinstance(obj, torch.Tensor) and (why := _unsavable(obj))
    ]
    if bad:
        raise CheckpointError(f"cannot save {len(bad)} tensor(s): " + "; ".join(bad[:20]))


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


def check_checkpointer_options(
    *, threads, cooperative, compress, manifests="auto", **options
) -> None:
    """ValueError naming the first of Checkpointer's arguments that is out of range or not
    one of its allowed values (before anything is opened or spawned)."""
    check_options(**options)
    if threads is not None:
        check_options(threads=threads)
    if not (cooperative is True or cooperative is False or cooperative == "broadcast"):
        raise ValueError(f"cooperative must be True, False or 'broadcast', got {cooperative!r:.40}")
    if not (compress is True or compress is False or compress == "auto"):
        raise ValueError(f"compress must be True, False or 'auto', got {compress!r:.40}")
    if manifests not in ("auto", "step", "rank"):
        raise ValueError(f"manifests must be 'auto', 'step' or 'rank', got {manifests!r:.40}")

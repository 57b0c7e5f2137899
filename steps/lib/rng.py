"""Every RNG of a process: seeding for determinism, and the states a resume restores.

Everything is deterministic for a given seed and world size: model init is seeded on every
rank, the data is a function of the position, and each rank's RNG state is saved (see
`state.rng_entry`) so a resume replays the same dropout masks.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from ckptflow import env


def set_deterministic(seed: int) -> None:
    """Seed every RNG and ask for deterministic kernels (bitwise-equal resume needs both)."""
    env.prepare_deterministic_cuda()
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    if torch.cuda.is_available():
        # CPU kernels used here are deterministic already; this call imports torch._dynamo
        # (seconds of start-up), so it is made only where it matters.
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False


def rng_state(device: torch.device) -> dict:
    """This process's RNG states: torch CPU, CUDA (when used), Python `random`, numpy."""
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(torch.as_tensor(state["torch"], dtype=torch.uint8).cpu())
    version, internal, gauss = state["python"]
    random.setstate((int(version), tuple(int(v) for v in internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state(
        (str(kind), np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached))
    )
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(torch.as_tensor(state["cuda"], dtype=torch.uint8).cpu(), device)

"""The benchmarks' state: an LLM-shaped state dict (GPT-like fp32 weights plus AdamW exp_avg and
exp_avg_sq, made by real AdamW steps), its generation, its loading into resident memory, and the
digests every load is checked against."""

from __future__ import annotations

import math
import os
import zlib

import numpy as np
import torch
import xxhash

LR_INCREMENTAL = 1e-4  # the AdamW steps between a full save and its delta
WARM_LR = 3e-4  # the AdamW steps that make the generated state


def gpt_params(total_bytes: int, layers: int = 8) -> dict[str, tuple]:
    """Shapes of a GPT-like model whose fp32 weights + 2 AdamW moments take ~total_bytes."""
    n = total_bytes // 12  # 4 bytes weight + 4 exp_avg + 4 exp_avg_sq per parameter
    d = max(64, int(math.sqrt(0.8 * n / (12 * layers))) // 64 * 64)
    shapes: dict[str, tuple] = {}
    for i in range(layers):
        p = f"h.{i}"
        shapes |= {
            f"{p}.ln_1.weight": (d,),
            f"{p}.ln_1.bias": (d,),
            f"{p}.attn.c_attn.weight": (3 * d, d),
            f"{p}.attn.c_attn.bias": (3 * d,),
            f"{p}.attn.c_proj.weight": (d, d),
            f"{p}.attn.c_proj.bias": (d,),
            f"{p}.ln_2.weight": (d,),
            f"{p}.ln_2.bias": (d,),
            f"{p}.mlp.c_fc.weight": (4 * d, d),
            f"{p}.mlp.c_fc.bias": (4 * d,),
            f"{p}.mlp.c_proj.weight": (d, 4 * d),
            f"{p}.mlp.c_proj.bias": (d,),
        }
    shapes |= {"ln_f.weight": (d,), "ln_f.bias": (d,)}
    used = sum(math.prod(s) for s in shapes.values())
    vocab = max(64, (n - used) // d)
    return {"wte.weight": (vocab, d), **shapes}


def _init(name: str, shape: tuple, g: torch.Generator) -> torch.Tensor:
    """Trained-looking values: N(0, 0.02) matrices, LayerNorm gains near 1, small biases."""
    t = torch.randn(shape, generator=g)
    if ".ln_" in name or name.startswith("ln_f"):
        return 1.0 + 0.05 * t if name.endswith("weight") else 0.02 * t
    return (0.002 if name.endswith("bias") else 0.02) * t


def grad_scale(name: str, shape: tuple) -> torch.Tensor:
    """Per-row gradient scale (log-normal around 1e-3), fixed per tensor name: real gradients
    are far from uniform across rows, and the moments' statistics depend on it."""
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    s = 1e-3 * torch.exp(0.5 * torch.randn(shape[0], generator=g))
    return s.reshape((shape[0],) + (1,) * (len(shape) - 1))


class Trainer:
    """AdamW over the state's own tensors (in place), with random gradients."""

    def __init__(self, sd: dict, names: list[str], lr: float, seed: int):
        self.names = names
        self.params = {n: torch.nn.Parameter(sd[f"model.{n}"], requires_grad=True) for n in names}
        self.opt = torch.optim.AdamW(list(self.params.values()), lr=lr, weight_decay=0.1)
        for n, p in self.params.items():
            self.opt.state[p] = {
                "step": sd[f"optim.{n}.step"],
                "exp_avg": sd[f"optim.{n}.exp_avg"],
                "exp_avg_sq": sd[f"optim.{n}.exp_avg_sq"],
            }
        self.g = torch.Generator().manual_seed(seed)
        self.scale = {n: grad_scale(n, tuple(p.shape)) for n, p in self.params.items()}

    def step(self, only: list[str] | None = None) -> None:
        for n, p in self.params.items():
            p.grad = None
            if only is None or n in only:
                p.grad = torch.randn(p.shape, generator=self.g) * self.scale[n]
        self.opt.step()


def make_state(total_bytes: int, path: str, warm_steps: int = 5, seed: int = 0) -> dict:
    """Generate the fp32 state into path: trained-looking weights and AdamW moments.

    The moments start at their stationary distribution for a run at step 1000 under the same
    random gradients (exp_avg ~ N(0, s^2 (1-b1)/(1+b1)), exp_avg_sq ~ s^2 (1 + 4.5% noise)),
    then `warm_steps` real AdamW steps run on them. (Running 1000 steps would take as long as
    the benchmark; starting from zero moments would leave exp_avg_sq in its ramp-up, where it
    doubles every few steps, which no checkpoint of a real run looks like.)
    """
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    shapes = gpt_params(total_bytes)
    sd = {}
    for n, shape in shapes.items():
        s = grad_scale(n, shape).expand(shape)
        sd[f"model.{n}"] = _init(n, shape, g)
        sd[f"optim.{n}.exp_avg"] = s * math.sqrt(0.1 / 1.9) * torch.randn(shape, generator=g)
        sd[f"optim.{n}.exp_avg_sq"] = s**2 * (1 + 0.045 * torch.randn(shape, generator=g)).abs()
        sd[f"optim.{n}.step"] = torch.tensor(1000.0)
    tr = Trainer(sd, list(shapes), lr=WARM_LR, seed=seed + 1)
    for _ in range(warm_steps):
        tr.step()
    sd = {k: v.detach().contiguous() for k, v in sd.items()}
    save_file(sd, path)
    return {"names": list(shapes), "shapes": {k: list(v) for k, v in shapes.items()}}


def load_state(work: str, dtype: str) -> tuple[dict, dict]:
    """(fp32 state, the state to save in `dtype`) read from the parent's state file into the
    process's own memory, as a training state lives (and aligned as torch allocates).

    load_file's tensors view a private mapping of the file: after a cold load dropped the
    page cache, a save read the whole state back from the disk through page faults, and
    the saves and async stalls timed that read."""
    from safetensors.torch import load_file

    sd32 = {k: v.clone() for k, v in load_file(os.path.join(work, "state.safetensors")).items()}
    return sd32, as_dtype(sd32, dtype)


def as_dtype(sd32: dict, dtype: str) -> dict:
    if dtype == "fp32":
        return dict(sd32)
    return {k: v.detach().to(torch.bfloat16) for k, v in sd32.items()}


def digests(sd: dict) -> dict:
    """xxh3-128 of every tensor's bytes: reads every byte (the load 'touch') and verifies."""
    return {k: xxhash.xxh3_128_hexdigest(np_bytes(v)) for k, v in sd.items()}


def np_bytes(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()


def nbytes(sd: dict) -> int:
    return sum(v.numel() * v.element_size() for v in sd.values())


def expectation(sd: dict) -> dict:
    return {
        "tensors": {k: [list(v.shape), str(v.dtype).split(".")[-1]] for k, v in sd.items()},
        "digests": digests(sd),
    }


def template(expect: dict) -> dict:
    """Zeros of the expected shapes and dtypes: the in-place destination of DCP and ckptflow."""
    return {k: torch.zeros(s, dtype=getattr(torch, d)) for k, (s, d) in expect["tensors"].items()}

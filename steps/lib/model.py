"""A small GPT-style decoder: token + position embeddings, pre-norm blocks, a linear head.

Kept deliberately plain so that a reader can follow every tensor. `blocks` is a ModuleList so
that fine-tuning can freeze "all but the last K blocks" (`freeze_all_but_last`) and FSDP2 can
shard block by block. Named sizes run from `tiny` (CI: seconds on two CPU cores) to `large`
(about 300 M parameters, for the benchmark scale).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the decoder; saved in every checkpoint's metadata so a loader can rebuild it."""

    vocab_size: int = 32  # token ids the embedding holds (the char tokenizer needs fewer)
    seq_len: int = 64  # longest context the position embedding covers
    n_layer: int = 2  # number of transformer blocks
    n_head: int = 2  # attention heads per block
    d_model: int = 64  # residual stream width
    mlp_ratio: int = 4  # hidden width of the MLP as a multiple of d_model
    dropout: float = 0.0  # dropout on attention output, MLP output and embeddings
    bias: bool = True  # biases in Linear and LayerNorm layers

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        """Rebuild from `to_dict()` output, ignoring keys a newer version may have added."""
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


# Named sizes. Parameter counts are for vocab 32, seq_len 64 (about 12 * n_layer * d_model^2).
SIZES: dict[str, ModelConfig] = {
    "tiny": ModelConfig(n_layer=2, n_head=2, d_model=64),  # ~0.1 M: CI
    "small": ModelConfig(n_layer=4, n_head=4, d_model=128),  # ~0.8 M: local demos
    "medium": ModelConfig(n_layer=8, n_head=8, d_model=512),  # ~25 M
    "base": ModelConfig(n_layer=12, n_head=12, d_model=768),  # ~85 M
    "large": ModelConfig(n_layer=24, n_head=16, d_model=1024),  # ~300 M: benchmark scale
}


def config_for(name: str, **overrides) -> ModelConfig:
    """The named size with fields overridden (e.g. seq_len, dropout, vocab_size)."""
    if name not in SIZES:
        raise ValueError(f"unknown model size {name!r}: choose one of {', '.join(SIZES)}")
    return replace(SIZES[name], **{k: v for k, v in overrides.items() if v is not None})


class CausalSelfAttention(nn.Module):
    """Multi-head attention that only looks backwards (scaled_dot_product_attention, causal)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.d_model % cfg.n_head:
            raise ValueError(f"d_model {cfg.d_model} is not divisible by n_head {cfg.n_head}")
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        # (b, t, c) -> (b, heads, t, head_dim)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """The decoder. forward(ids) -> logits; forward(ids, targets) -> (logits, mean loss)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init_weights)
        # GPT-2's scaled init of residual projections keeps the stream's variance bounded.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor | None = None):
        t = ids.shape[1]
        if t > self.cfg.seq_len:
            raise ValueError(
                f"sequence of {t} tokens exceeds the model's seq_len {self.cfg.seq_len}"
            )
        pos = torch.arange(t, device=ids.device)
        x = self.drop(self.tok_emb(ids) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
        return logits, loss

    @torch.no_grad()
    def generate(self, ids: torch.Tensor, n_new: int) -> torch.Tensor:
        """Greedy continuation of a batch of equal-length prompts by `n_new` tokens."""
        for _ in range(n_new):
            logits = self(ids[:, -self.cfg.seq_len :])
            ids = torch.cat([ids, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
        return ids


def count_parameters(model: nn.Module) -> int:
    """Number of parameters (of the full model, also when sharded: DTensor numel is global)."""
    return sum(p.numel() for p in model.parameters())


def freeze_all_but_last(model: GPT, k: int) -> list[str]:
    """Freeze everything except the last `k` blocks, the final norm and the head.

    Returns the names of the parameters left trainable. k = 0 trains only ln_f and the head;
    k >= n_layer trains every block (embeddings stay frozen).
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    n = len(model.blocks)
    trainable_prefixes = [f"blocks.{i}." for i in range(max(0, n - k), n)] + ["ln_f.", "head."]
    names = []
    for name, p in model.named_parameters():
        p.requires_grad = any(name.startswith(pre) for pre in trainable_prefixes)
        if p.requires_grad:
            names.append(name)
    return names

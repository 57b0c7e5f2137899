"""ckptflow's GPT as a Hugging Face `transformers` GPT-2: a folder that
`transformers.AutoModelForCausalLM.from_pretrained(folder)` loads, with the same logits.

The decoder maps onto GPT-2 exactly: learned token and position embeddings, pre-norm blocks
(LayerNorm eps 1e-5), one fused q|k|v projection split head by head as GPT-2 splits it, an
exact (erf) GELU MLP, a final LayerNorm and an untied bias-free head. Only the layout differs:
GPT-2 stores its projections as `Conv1D` (weight `(in, out)`, the transpose of `nn.Linear`'s),
under `transformer.h.{i}.…` names, and always has biases (a model built with `bias=False` gets
zeros, which is the same function). The ckptflow export keeps the model's own names (what
`ckpt import`, the registered pyfunc and `safetensors` readers use), so this is a separate
folder: `ckptflow hf-export SOURCE [STEP] --to DIR`.

Token ids are the characters of `ckptflow.steps.lib.data.VOCAB` (no tokenizer files: the
vocabulary is written into config.json as `ckptflow_vocab`).
"""

from __future__ import annotations

import json
import os

import torch
from ckptflow.steps.lib.data import VOCAB
from ckptflow.steps.lib.model import ModelConfig
from safetensors.torch import save_file

CONV1D = ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")  # nn.Linear here, Conv1D in GPT-2
BLOCK = {
    "ln1": "ln_1",
    "attn.qkv": "attn.c_attn",
    "attn.proj": "attn.c_proj",
    "ln2": "ln_2",
    "mlp.fc": "mlp.c_fc",
    "mlp.proj": "mlp.c_proj",
}
TOP = {"tok_emb": "transformer.wte", "pos_emb": "transformer.wpe", "ln_f": "transformer.ln_f"}


def gpt2_config(cfg: ModelConfig) -> dict:
    """config.json of the equivalent `GPT2LMHeadModel`."""
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.seq_len,
        "n_embd": cfg.d_model,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": cfg.mlp_ratio * cfg.d_model,
        "activation_function": "gelu",  # torch's exact GELU (F.gelu), not GPT-2's gelu_new
        "layer_norm_epsilon": 1e-5,  # nn.LayerNorm's default
        "resid_pdrop": cfg.dropout,
        "embd_pdrop": cfg.dropout,
        "attn_pdrop": 0.0,  # ckptflow applies dropout to the attention output, not its weights
        "tie_word_embeddings": False,  # the head is its own matrix
        "scale_attn_weights": True,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": VOCAB.index(";"),  # a statement's end: generate() stops there
        "pad_token_id": None,
        "ckptflow_vocab": VOCAB,
        "ckptflow_model_config": cfg.to_dict(),
    }


def _bias(tensors: dict, name: str, size: int) -> torch.Tensor:
    """The bias, or zeros for a model built without biases (the same function)."""
    return tensors[name] if name in tensors else torch.zeros(size)


def gpt2_state_dict(tensors: dict[str, torch.Tensor], cfg: ModelConfig) -> dict:
    """ckptflow GPT tensors -> GPT-2 names and layouts (fp32, contiguous); every input tensor
    must be used, so a model this mapping does not know fails here, not at load."""
    t = {k: v.float() for k, v in tensors.items()}
    out = {f"{TOP[k]}.weight": t[f"{k}.weight"] for k in TOP}
    out["transformer.ln_f.bias"] = _bias(t, "ln_f.bias", cfg.d_model)
    out["lm_head.weight"] = t["head.weight"]
    for i in range(cfg.n_layer):
        for ours, theirs in BLOCK.items():
            w = t[f"blocks.{i}.{ours}.weight"]
            size = w.shape[0]
            out[f"transformer.h.{i}.{theirs}.weight"] = w.t() if ours in CONV1D else w
            out[f"transformer.h.{i}.{theirs}.bias"] = _bias(t, f"blocks.{i}.{ours}.bias", size)
    used = {f"{k}.weight" for k in TOP} | {"ln_f.bias", "head.weight"}
    used |= {
        f"blocks.{i}.{o}.{p}" for i in range(cfg.n_layer) for o in BLOCK for p in ("weight", "bias")
    }
    extra = sorted(set(t) - used)
    if extra:
        raise ValueError(f"tensors GPT-2 has no place for: {', '.join(extra[:5])}")
    return {k: v.contiguous() for k, v in out.items()}


def write(tensors: dict[str, torch.Tensor], model_config: dict, folder: str) -> str:
    """A transformers GPT-2 folder (config.json, model.safetensors) at local `folder`, which
    must be absent or empty (nothing of another model is overwritten)."""
    if os.path.isdir(folder) and os.listdir(folder):
        raise ValueError(f"{folder} is not empty: choose a new folder for the GPT-2 export")
    cfg = ModelConfig.from_dict(model_config)
    os.makedirs(folder, exist_ok=True)
    save_file(gpt2_state_dict(tensors, cfg), os.path.join(folder, "model.safetensors"),
              metadata={"format": "pt"})  # fmt: skip
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(gpt2_config(cfg), fh, indent=1, sort_keys=True)
    return folder

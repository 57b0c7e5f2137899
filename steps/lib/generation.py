"""Run a trained model: rebuild it from an export folder or a checkpoint, complete prompts
greedily, score a task by exact match.

Shared by the registered MLflow model (`steps.lib.pyfunc_model`) and `ckptflow generate` /
`ckptflow evaluate`, so a checkpoint, its export and its registered version answer the same
prompt with the same text. A completion ends with the statement's `;` (kept, as in the task's
answers) or after `max_new_tokens` tokens.
"""

from __future__ import annotations

import json
import os

import torch
from ckptflow.steps.lib.data import Corpus, decode, encode
from ckptflow.steps.lib.model import GPT, ModelConfig
from safetensors import safe_open

END = ";"  # what ends a statement: generation stops there
DEFAULT_NEW_TOKENS = 8  # longer than any task's answer (mul: 4 digits and `;`)
MAX_NEW_TOKENS = 4096  # a bound on a caller's request (each token is one forward pass)
MAX_PROMPTS = 10_000
MAX_CONFIG_BYTES = 1 << 20


def model_from_tensors(tensors: dict[str, torch.Tensor], model_config: dict) -> GPT:
    """A GPT in eval mode holding `tensors` (fp32); a missing or extra tensor is an error."""
    model = GPT(ModelConfig.from_dict(model_config))
    model.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
    return model.eval()


def _safetensors_files(folder: str) -> list[str]:
    names = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
    if not names:
        raise ValueError(f"{folder}: no .safetensors file (not a ckptflow export folder)")
    return [os.path.join(folder, n) for n in names]


def load_export(folder: str) -> GPT:
    """The model of a local export folder (`model.safetensors` or its shards, the model config
    from the files' metadata, else from `config.json`)."""
    tensors, config = {}, None
    for path in _safetensors_files(folder):
        with safe_open(path, "pt") as f:
            meta = f.metadata() or {}
            if config is None and meta.get("model_config"):
                config = json.loads(meta["model_config"])
            for k in f.keys():  # noqa: SIM118 - safe_open is not a dict
                tensors[k] = f.get_tensor(k)
    if config is None:
        path = os.path.join(folder, "config.json")
        if not os.path.exists(path) or os.path.getsize(path) > MAX_CONFIG_BYTES:
            raise ValueError(f"{folder}: no model_config in the weights and no usable config.json")
        with open(path) as fh:
            config = json.load(fh)
    if not isinstance(config, dict):
        raise ValueError(f"{folder}: the model config is not a JSON object")
    return model_from_tensors(tensors, config)


def load_checkpoint(ckpt_uri: str, step: int) -> GPT:
    """The model of a committed step (a run root or a checkpoint root; every byte verified)."""
    from ckptflow.steps.lib.eval_results import ckpt_storage
    from ckptflow.steps.lib.export import load_model_weights

    tensors, meta = load_model_weights(ckpt_storage(ckpt_uri).uri, step)
    return model_from_tensors(tensors, meta["model_config"])


@torch.no_grad()
def complete(model: GPT, prompts: list[str], max_new_tokens: int = DEFAULT_NEW_TOKENS) -> list[str]:
    """Greedy continuation of each prompt, cut after its first `;` (kept) or at
    `max_new_tokens`; prompts of equal length are run as one batch."""
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise ValueError(f"max_new_tokens must be 1..{MAX_NEW_TOKENS}, got {max_new_tokens}")
    if len(prompts) > MAX_PROMPTS:
        raise ValueError(f"{len(prompts)} prompts: at most {MAX_PROMPTS} per call")
    out: list[str] = [""] * len(prompts)
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError("an empty prompt: give at least one character")
        by_len.setdefault(len(p), []).append(i)
    end = encode(END)[0]
    for idxs in by_len.values():
        ids = torch.tensor([encode(prompts[i]) for i in idxs])
        start = ids.shape[1]
        for _ in range(max_new_tokens):
            logits = model(ids[:, -model.cfg.seq_len :])
            ids = torch.cat([ids, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
            if bool((ids[:, start:] == end).any(dim=1).all()):
                break  # every row has ended its statement
        for row, i in zip(ids[:, start:].tolist(), idxs, strict=True):
            text = decode(row)
            out[i] = text[: text.index(END) + 1] if END in text else text
    return out


def exact_match(predict, task: str, seed: int = 0, n: int = 64) -> tuple[float, list]:
    """Exact match of `predict` (prompts -> completions) on the task's first `n` validation
    problems, the set the training evaluator uses; (score, [(prompt, answer, got)])."""
    problems = Corpus(task, seed).exact_match_set(n)
    got = list(predict([p for p, _ in problems]))
    rows = [(p, a, g) for (p, a), g in zip(problems, got, strict=True)]
    return sum(a == g for _, a, g in rows) / max(1, len(rows)), rows

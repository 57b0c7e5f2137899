"""A generated corpus: a tiny synthetic language, deterministic from a seed, no downloads.

A *task* is a family of statements `PROMPT=ANSWER;` written with fixed-width digits, e.g.
`add`: `07+12=019;`, `sub`: `57-12=45;`, `rev`: `R31415=51413;`. The pretraining text is an
endless stream of such statements; each problem belongs to the train or the validation split
by a seeded hash, so validation measures generalisation to unseen problems. The exact-match
task gives the model a validation prompt and checks its greedy answer character by character.

Sample `i` of a split is a pure function of (task, seed, split, i), so the data loader's whole
state is one integer: the number of sequences consumed (`position`). That makes resume exact
and lets a run resume into a different world size (the same global batches, split otherwise).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

# The char vocabulary shared by every task, so a model pretrained on one can fine-tune on another.
VOCAB = "0123456789+-*=;RS"
_STOI = {c: i for i, c in enumerate(VOCAB)}
SPLITS = ("train", "validation")
VAL_PERCENT = 10  # share of problems held out for validation


def encode(text: str) -> list[int]:
    """Char-level token ids; unknown characters are a user error (wrong task text)."""
    try:
        return [_STOI[c] for c in text]
    except KeyError as exc:
        raise ValueError(f"character {exc.args[0]!r} is not in the vocabulary {VOCAB!r}") from None


def decode(ids) -> str:
    """Text of token ids; ids the vocabulary lacks (an untrained model emits them) become '?'."""
    return "".join(VOCAB[i] if 0 <= (i := int(t)) < len(VOCAB) else "?" for t in ids)


# -- tasks ---------------------------------------------------------------------------------------
def _add(rng: np.random.Generator) -> tuple[str, str]:
    a, b = rng.integers(0, 100, size=2)
    return f"{a:02d}+{b:02d}=", f"{a + b:03d};"


def _sub(rng: np.random.Generator) -> tuple[str, str]:
    a, b = sorted(rng.integers(0, 100, size=2), reverse=True)
    return f"{a:02d}-{b:02d}=", f"{a - b:02d};"


def _mul(rng: np.random.Generator) -> tuple[str, str]:
    a, b = rng.integers(0, 32, size=2)
    return f"{a:02d}*{b:02d}=", f"{a * b:04d};"


def _digits(rng: np.random.Generator) -> str:
    return "".join(str(d) for d in rng.integers(0, 10, size=5))


def _rev(rng: np.random.Generator) -> tuple[str, str]:
    s = _digits(rng)
    return f"R{s}=", f"{s[::-1]};"


def _sort(rng: np.random.Generator) -> tuple[str, str]:
    s = _digits(rng)
    return f"S{s}=", f"{''.join(sorted(s))};"


TASKS: dict[str, Callable[[np.random.Generator], tuple[str, str]]] = {
    "add": _add,
    "sub": _sub,
    "mul": _mul,
    "rev": _rev,
    "sort": _sort,
}


def check_task(name: str) -> str:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}: choose one of {', '.join(TASKS)}")
    return name


@dataclass(frozen=True)
class Corpus:
    """The statements of one task, split into train and validation by a seeded hash."""

    task: str = "add"  # which generator (a key of TASKS)
    seed: int = 0  # decides the split and every sample

    def __post_init__(self):
        check_task(self.task)

    def split_of(self, prompt: str) -> str:
        """'validation' for VAL_PERCENT % of problems (stable across runs and machines)."""
        h = zlib.crc32(f"{self.seed}:{self.task}:{prompt}".encode())
        return "validation" if h % 100 < VAL_PERCENT else "train"

    def _rng(self, split: str, index: int, stream: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, SPLITS.index(split), stream, index])

    def problem(self, split: str, rng: np.random.Generator) -> tuple[str, str]:
        """Draw problems until one belongs to `split` (rejection sampling)."""
        while True:
            prompt, answer = TASKS[self.task](rng)
            if self.split_of(prompt) == split:
                return prompt, answer

    def text(self, split: str, index: int, n_chars: int) -> str:
        """Sample `index` of `split`: whole statements, cut to exactly `n_chars` characters."""
        rng = self._rng(split, index, stream=0)
        parts, length = [], 0
        while length < n_chars:
            prompt, answer = self.problem(split, rng)
            parts.append(prompt + answer)
            length += len(parts[-1])
        return "".join(parts)[:n_chars]

    def sample(self, split: str, index: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(input ids, next-token targets), each `seq_len` long."""
        ids = torch.tensor(encode(self.text(split, index, seq_len + 1)), dtype=torch.long)
        return ids[:-1], ids[1:]

    def batch(self, split: str, indices, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = [self.sample(split, i, seq_len) for i in indices]
        return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])

    def exact_match_set(self, n: int) -> list[tuple[str, str]]:
        """The first `n` validation problems (prompt, answer); the same set for every model."""
        rng = self._rng("validation", 0, stream=1)
        return [self.problem("validation", rng) for _ in range(n)]


class ShardedLoader:
    """Global batches of the train split, sharded across ranks and gradient-accumulation steps.

    The state is `position`: sequences consumed so far by the whole job. An optimizer step
    takes the next `global_batch` sequences; micro-step m of rank r gets a contiguous slice of
    them. Because the slices depend on the world size but the global batch does not, a resume
    into another world size trains on exactly the same data.
    """

    def __init__(
        self,
        corpus: Corpus,
        *,
        seq_len: int,
        global_batch: int,
        grad_accum: int = 1,
        rank: int = 0,
        world_size: int = 1,
        position: int = 0,
    ):
        per = grad_accum * world_size
        if global_batch % per:
            raise ValueError(
                f"batch size {global_batch} must be divisible by grad_accum x world size = "
                f"{grad_accum} x {world_size}: change --batch-size or --grad-accum"
            )
        self.corpus, self.seq_len = corpus, seq_len
        self.global_batch, self.grad_accum = global_batch, grad_accum
        self.rank, self.world_size = rank, world_size
        self.micro = global_batch // per  # sequences per rank per micro-step
        self.position = position

    def next_step(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's `grad_accum` micro-batches for the next optimizer step; advances position."""
        out = []
        for m in range(self.grad_accum):
            start = self.position + (m * self.world_size + self.rank) * self.micro
            out.append(self.corpus.batch("train", range(start, start + self.micro), self.seq_len))
        self.position += self.global_batch
        return out

    def state_dict(self) -> dict:
        return {"position": self.position, "task": self.corpus.task, "seed": self.corpus.seed}

    def load_state_dict(self, state: dict) -> None:
        if state.get("task", self.corpus.task) != self.corpus.task:
            raise ValueError(
                f"checkpoint was trained on task {state['task']!r}, this run uses "
                f"{self.corpus.task!r}: pass the same --task to resume"
            )
        self.position = int(state["position"])

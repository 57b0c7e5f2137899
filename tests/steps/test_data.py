"""The generated corpus: determinism, correct statements, disjoint splits, sharded loading."""

from __future__ import annotations

import re

import pytest
import torch
from ckptflow.steps.lib.data import TASKS, VOCAB, Corpus, ShardedLoader, decode, encode


def test_tokenizer_round_trip_and_unknown_characters():
    text = "07+12=019;R12345=54321;"
    assert decode(encode(text)) == text
    assert max(encode(VOCAB)) == len(VOCAB) - 1
    with pytest.raises(ValueError, match="not in the vocabulary"):
        encode("hello")


def test_samples_are_deterministic_and_depend_on_seed_and_index():
    a, b = Corpus("add", 1), Corpus("add", 2)
    assert a.text("train", 5, 64) == Corpus("add", 1).text("train", 5, 64)
    assert a.text("train", 5, 64) != a.text("train", 6, 64)
    assert a.text("train", 5, 64) != b.text("train", 5, 64)
    assert len(a.text("train", 0, 100)) == 100


@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_statement_is_correct(task):
    c = Corpus(task, 0)
    for prompt, answer in c.exact_match_set(50):
        body, result = prompt[:-1], answer[:-1]
        if task in ("add", "sub", "mul"):
            a, op, b = re.fullmatch(r"(\d+)([-+*])(\d+)", body).groups()
            assert int(result) == {"+": int.__add__, "-": int.__sub__, "*": int.__mul__}[op](
                int(a), int(b)
            )
        elif task == "rev":
            assert result == body[1:][::-1]
        else:
            assert result == "".join(sorted(body[1:]))


def test_train_and_validation_problems_are_disjoint():
    c = Corpus("add", 0)
    val = {p for p, _ in c.exact_match_set(200)}
    assert all(c.split_of(p) == "validation" for p in val)
    train_prompts = set()
    for i in range(100):
        train_prompts |= set(re.findall(r"\d\d\+\d\d=", c.text("train", i, 200)))
    assert train_prompts and not (train_prompts & val)
    share = sum(
        c.split_of(f"{a:02d}+{b:02d}=") == "validation" for a in range(100) for b in range(100)
    )
    assert 700 < share < 1300  # about 10 % held out


def test_sample_targets_are_inputs_shifted_by_one():
    x, y = Corpus("sub", 3).sample("train", 7, 32)
    assert x.shape == y.shape == (32,)
    assert torch.equal(x[1:], y[:-1])


def test_sharded_loader_covers_the_same_global_batch_in_any_world_size():
    c = Corpus("add", 0)
    one = ShardedLoader(c, seq_len=16, global_batch=8, grad_accum=2)
    two = [
        ShardedLoader(c, seq_len=16, global_batch=8, grad_accum=2, rank=r, world_size=2)
        for r in (0, 1)
    ]
    for _ in range(2):
        whole = torch.cat([x for x, _ in one.next_step()])
        parts = torch.cat([x for ld in two for x, _ in ld.next_step()])
        assert sorted(map(tuple, whole.tolist())) == sorted(map(tuple, parts.tolist()))
    assert one.position == two[0].position == 16


def test_loader_position_is_its_whole_state():
    c = Corpus("add", 0)
    a = ShardedLoader(c, seq_len=16, global_batch=4)
    a.next_step()
    b = ShardedLoader(c, seq_len=16, global_batch=4)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.next_step()[0][0], b.next_step()[0][0])
    with pytest.raises(ValueError, match="same --task"):
        ShardedLoader(Corpus("rev", 0), seq_len=16, global_batch=4).load_state_dict(a.state_dict())


def test_indivisible_batch_names_the_fix():
    with pytest.raises(ValueError, match="--batch-size"):
        ShardedLoader(Corpus(), seq_len=8, global_batch=6, grad_accum=2, world_size=2)
    with pytest.raises(ValueError, match="unknown task"):
        Corpus("poetry")

"""The GPT decoder: shapes, causality, named sizes, greedy generation and freezing."""

from __future__ import annotations

import pytest
import torch
from ckptflow.steps.lib.model import (
    GPT,
    SIZES,
    ModelConfig,
    config_for,
    count_parameters,
    freeze_all_but_last,
)


def tiny(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(config_for("tiny", **kw))


def test_forward_shapes_and_loss_of_untrained_model_is_near_uniform():
    model = tiny()
    ids = torch.randint(0, 17, (3, 20))
    logits, loss = model(ids, ids)
    assert logits.shape == (3, 20, model.cfg.vocab_size)
    # small init: predictions are close to uniform over the vocabulary
    assert abs(float(loss.detach()) - torch.log(torch.tensor(32.0)).item()) < 0.2


def test_attention_is_causal():
    model = tiny().eval()
    ids = torch.randint(0, 17, (1, 16))
    changed = ids.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % 17
    a, b = model(ids), model(changed)
    assert torch.equal(a[0, :10], b[0, :10])  # the past never sees the future
    assert not torch.allclose(a[0, 10:], b[0, 10:])


def test_named_sizes_span_ci_to_a_few_hundred_million_parameters():
    assert count_parameters(tiny()) < 200_000
    with torch.device("meta"):  # no memory: only the parameter count is wanted
        large = GPT(config_for("large"))
    assert 250e6 < count_parameters(large) < 400e6
    assert list(SIZES)[0] == "tiny"


def test_config_overrides_and_round_trip():
    cfg = config_for("small", seq_len=32, dropout=0.1)
    assert (cfg.n_layer, cfg.seq_len, cfg.dropout) == (4, 32, 0.1)
    assert ModelConfig.from_dict({**cfg.to_dict(), "added_later": 1}) == cfg
    with pytest.raises(ValueError, match="choose one of"):
        config_for("gigantic")


def test_too_long_input_is_a_clear_error():
    with pytest.raises(ValueError, match="exceeds the model's seq_len"):
        tiny(seq_len=8)(torch.zeros(1, 9, dtype=torch.long))


def test_generate_appends_greedy_tokens():
    model = tiny().eval()
    ids = torch.randint(0, 17, (2, 5))
    out = model.generate(ids, 4)
    assert out.shape == (2, 9) and torch.equal(out[:, :5], ids)
    assert torch.equal(out[:, 5], model(ids)[:, -1].argmax(-1))


def test_freeze_all_but_last_k_blocks():
    model = tiny()
    names = freeze_all_but_last(model, 1)
    assert all(n.startswith(("blocks.1.", "ln_f.", "head.")) for n in names)
    assert any(n.startswith("blocks.1.") for n in names)
    assert not model.blocks[0].attn.qkv.weight.requires_grad
    assert not model.tok_emb.weight.requires_grad
    assert model.head.weight.requires_grad
    assert len(freeze_all_but_last(model, 0)) == 3  # ln_f weight, ln_f bias, head
    with pytest.raises(ValueError):
        freeze_all_but_last(model, -1)

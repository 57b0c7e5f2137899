"""The GPT-2 export: `transformers.AutoModelForCausalLM.from_pretrained` loads it as a
GPT2LMHeadModel whose logits and greedy completions are the ckptflow model's (with and without
biases); a folder that is not empty is refused."""

from __future__ import annotations

import pytest
import torch
from ckptflow.steps.lib import generation, hf_gpt2
from ckptflow.steps.lib.data import VOCAB, decode, encode
from ckptflow.steps.lib.model import GPT, config_for

transformers = pytest.importorskip("transformers")  # the `hf` extra


@pytest.mark.parametrize("bias", [True, False])
def test_transformers_loads_the_same_model(tmp_path, bias):
    torch.manual_seed(7)
    model = GPT(config_for("tiny", bias=bias, dropout=0.1)).eval()
    hf_gpt2.write(model.state_dict(), model.cfg.to_dict(), str(tmp_path / "g"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "g")).eval()
    assert type(hf).__name__ == "GPT2LMHeadModel"
    ids = torch.randint(0, len(VOCAB), (4, model.cfg.seq_len))
    with torch.no_grad():
        assert torch.allclose(hf(ids).logits, model(ids), atol=1e-5)
    prompt = "R12345="
    out = hf.generate(torch.tensor([encode(prompt)]), max_new_tokens=8, do_sample=False)
    text = decode(out[0, len(prompt) :].tolist())
    assert text == generation.complete(model, [prompt])[0]  # eos: the statement's `;`
    assert hf.config.ckptflow_vocab == VOCAB


def test_a_folder_that_is_not_empty_is_refused(tmp_path):
    model = GPT(config_for("tiny"))
    (tmp_path / "old.txt").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        hf_gpt2.write(model.state_dict(), model.cfg.to_dict(), str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.txt"]


def test_a_tensor_gpt2_has_no_place_for_is_refused():
    model = GPT(config_for("tiny"))
    tensors = {**model.state_dict(), "extra.weight": torch.zeros(1)}
    with pytest.raises(ValueError, match="extra.weight"):
        hf_gpt2.gpt2_state_dict(tensors, model.cfg)

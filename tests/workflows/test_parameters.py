"""Per-run knobs (workflows/parameters.py): what `-p` may give to `ckptflow run NAME --local`
and `ckptflow submit` is bounded like `--set`: a bad value is one line naming the parameter,
and nothing is rendered or run."""

from __future__ import annotations

import json

import pytest
from ckptflow.workflows.config import ConfigError, PipelineConfig
from ckptflow.workflows.parameters import MAX_VALUE, MAX_VARIANTS, PIPELINE, check_values


def _variants(*items) -> str:
    return json.dumps([{"lr": lr, "freeze": freeze} for lr, freeze in items])


@pytest.mark.parametrize(
    "name, value, why",
    [
        # variant values become folder and Argo node names (lr{lr}-freeze{freeze})
        ("variants", _variants(("inf", "0")), "lr is a number"),
        ("variants", _variants(("1_0", "0")), "lr is a number"),
        ("variants", _variants((" 1e-3", "0")), "lr is a number"),
        ("variants", _variants(("1e-3", "\u0661")), "freeze a whole number"),
        ("variants", _variants(("1e-3", "+1")), "freeze a whole number"),
        ("variants", _variants(("1e-3", "99999999999")), "freeze a whole number"),
        ("variants", _variants(("11", "0")), "at most 10"),
        ("variants", _variants(*[("1e-3", str(i)) for i in range(MAX_VARIANTS + 1)]), f"at most {MAX_VARIANTS} variants"),
        ("metric", "m" * (MAX_VALUE + 1), f"at most {MAX_VALUE} characters"),
        ("metric", "val loss\n", "an eval.json metric name"),
        ("metric", "../x", "an eval.json metric name"),
        ("finetune_task", "x" * 10**6, f"at most {MAX_VALUE} characters"),
    ],
)  # fmt: skip
def test_a_bad_per_run_value_is_one_line_naming_the_parameter(name, value, why):
    with pytest.raises(ConfigError) as err:
        check_values(PipelineConfig(), PIPELINE, {name: value})
    text = str(err.value)
    assert text.startswith(f"-p {name}=") and why in text, text
    assert "\n" not in text and len(text) < 400, text


@pytest.mark.parametrize(
    "name, value",
    [
        ("variants", _variants(("1e-3", "0"), ("3e-4", "2"), ("0.01", "1"))),
        ("metric", "exact_match"),
        ("metric", "eval/val_loss"),
    ],
)
def test_good_per_run_values_pass(name, value):
    check_values(PipelineConfig(), PIPELINE, {name: value})

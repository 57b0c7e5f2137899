"""`--set key=value` overrides: typed conversion, nested sections, clear errors."""

from __future__ import annotations

import dataclasses

import pytest
from ckptflow.workflows.config import (
    ConfigError,
    PipelineConfig,
    Resources,
    apply_overrides,
    describe,
    setting_keys,
)

from ckptflow.contract import FinetuneArgs, PretrainArgs, SelectArgs


def test_overrides_convert_to_the_field_types():
    cfg = apply_overrides(
        PipelineConfig(),
        [
            "pretrain.ranks=4",
            "pretrain.lr=1e-4",
            "pretrain.async_save=false",
            "finetune.lrs=1e-3, 5e-4,2e-4",
            "finetune.freeze_blocks=0,2",
            "platform.tolerations=gpu=true:NoSchedule,spot:NoExecute",
            "platform.image=registry.local/ckptflow:dev",
            "pretrain.rank_resources.gpu=8",
            "retention.schedules=0 * * * *,30 3 * * *",
        ],
    )
    assert cfg.pretrain.ranks == 4
    assert cfg.pretrain.train.lr == pytest.approx(1e-4)
    assert cfg.pretrain.train.async_save is False
    assert cfg.finetune.lrs == (1e-3, 5e-4, 2e-4)
    assert cfg.finetune.freeze_blocks == (0, 2)
    assert cfg.platform.tolerations == ("gpu=true:NoSchedule", "spot:NoExecute")
    assert cfg.platform.image == "registry.local/ckptflow:dev"
    assert cfg.pretrain.rank_resources == Resources(cpu="1", memory="1536Mi", gpu=8)
    assert cfg.retention.schedules == ("0 * * * *", "30 3 * * *")
    # The original is untouched: configs are frozen values.
    assert PipelineConfig().pretrain.ranks == 2


def test_empty_value_gives_an_empty_list_or_string():
    cfg = apply_overrides(PipelineConfig(), ["platform.s3_secret=", "platform.node_selector="])
    assert cfg.platform.s3_secret == ""
    assert cfg.platform.node_selector == ()


def test_later_overrides_win():
    cfg = apply_overrides(PipelineConfig(), ["pretrain.ranks=3", "pretrain.ranks=5"])
    assert cfg.pretrain.ranks == 5


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("pretrain.rankz=3", "did you mean pretrain.ranks"),
        ("pretrian.ranks=3", "did you mean pretrain.ranks"),
        ("nonsense=1", "unknown setting"),
        ("pretrain.ranks=two", "expected int"),
        ("pretrain.lr=fast", "expected float"),
        ("pretrain.async_save=maybe", "expected true or false"),
        ("finetune.lrs=1e-3,x", "expected float"),
        ("pretrain=1", "is a section"),
        ("pretrain.ranks", "expected KEY=VALUE"),
        ("=3", "expected KEY=VALUE"),
        ("pretrain.ranks.x=1", "unknown setting"),
    ],
)
def test_bad_overrides_say_what_to_do(assignment, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides(PipelineConfig(), [assignment])


def test_every_key_is_settable_and_described():
    keys = setting_keys()
    described = {line.split(" = ")[0] for line in describe()}
    assert set(keys) == described
    assert "pretrain.rank_resources.memory" in keys
    # Setting each key to its own rendered default round-trips.
    cfg = PipelineConfig()
    for line in describe():
        key, _, value = line.partition(" = ")
        cfg = apply_overrides(cfg, [f"{key}={value}"])
    assert cfg == PipelineConfig()


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        PipelineConfig().pretrain.ranks = 3  # type: ignore[misc]


def test_step_arguments_are_the_contracts_dataclasses_with_their_defaults():
    cfg = PipelineConfig()
    assert isinstance(cfg.pretrain.train, PretrainArgs)
    assert isinstance(cfg.finetune.train, FinetuneArgs)
    assert isinstance(cfg.finetune.select, SelectArgs)
    # Only what the workflow runs differently is stated; the rest is the step's own default.
    assert cfg.pretrain.train.seq_len == PretrainArgs(run_root="").seq_len
    assert cfg.pretrain.train.max_steps == 200
    cfg = apply_overrides(
        cfg,
        [
            "pretrain.dropout=0.1",
            "pretrain.evaluator.poll_seconds=2",
            "finetune.parallel=ddp",
            "finetune.metric=exact_match",
            "evaluate.task=rev",
        ],
    )
    assert cfg.pretrain.train.dropout == 0.1
    assert cfg.pretrain.evaluator.poll_seconds == 2.0
    assert cfg.finetune.train.parallel == "ddp"
    assert cfg.finetune.select.metric == "exact_match"
    assert cfg.evaluate.evaluator.task == "rev"


@pytest.mark.parametrize(
    "key",
    [
        "pretrain.mlflow_parent_run_id",  # filled in by the builder
        "pretrain.output_dir",
        "pretrain.train.max_steps",  # flat: the section's own key
        "finetune.lr",  # the grid's
        "finetune.candidates",
        "pretrain.evaluator.until_finished",
        "evaluate.step",
    ],
)
def test_wired_step_arguments_cannot_be_set(key):
    with pytest.raises(ConfigError, match="unknown setting"):
        apply_overrides(PipelineConfig(), [f"{key}=1"])


def test_no_key_is_named_twice():
    keys = setting_keys()
    assert len(keys) == len(set(keys))
    assert "finetune.freeze_blocks" in keys and "finetune.experiment" in keys

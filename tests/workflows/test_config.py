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
    assert cfg.pretrain.lr == pytest.approx(1e-4)
    assert cfg.pretrain.async_save is False
    assert cfg.finetune.lrs == (1e-3, 5e-4, 2e-4)
    assert cfg.finetune.freeze_blocks == (0, 2)
    assert cfg.platform.tolerations == ("gpu=true:NoSchedule", "spot:NoExecute")
    assert cfg.platform.image == "registry.local/ckptflow:dev"
    assert cfg.pretrain.rank_resources == Resources(cpu="2", memory="4Gi", gpu=8)
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

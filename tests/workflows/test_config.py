"""`--set key=value` overrides: typed conversion, nested sections, clear errors."""

from __future__ import annotations

import dataclasses

import pytest
from ckptflow.workflows.config import (
    ConfigError,
    PipelineConfig,
    Resources,
    Toleration,
    apply_overrides,
    describe,
    setting_keys,
    validate,
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
    assert cfg.platform.tolerations == (
        Toleration(key="gpu", operator="Equal", value="true", effect="NoSchedule"),
        Toleration(key="spot", operator="Exists", effect="NoExecute"),
    )
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
    assert cfg.pretrain.train.max_steps == 800  # the main job's recipe (issue 38)
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


# (setting, the allowed values or the fix the one line must name)
BAD_SETTINGS = [
    ("platform.image_pull_policy=Sometimes", "not one of Always, IfNotPresent, Never"),
    ("platform.pod_gc=Sometimes", "OnPodSuccess"),
    ("pretrain.ckpt_every=-5", "at least 1"),
    ("pretrain.ckpt_every=0", "at least 1"),
    ("finetune.mode=max2", "not one of min, max"),
    ("finetune.dtype=fp7", "not one of fp32, bf16"),
    ("pretrain.model=huge", "not one of tiny, small"),
    ("pretrain.task=divide", "not one of add"),
    ("finetune.parallel=tp", "not one of fsdp, ddp"),
    ("pretrain.ranks=0", "at least 1"),
    ("finetune.workers=-1", "at least 1"),
    ("pretrain.retries=-1", "at least 0"),
    ("pretrain.rdzv_port=70000", "1 to 65535"),
    ("finetune.lrs=1e-3,0", "above 0"),
    ("pretrain.lr=nan", "finite"),
    ("pretrain.dropout=1.5", "at most 1"),
    ("pretrain.ranks=100000000000000000000000", "at most 5000"),
    ("pretrain.ranks=1e23", "expected int"),
    ("finetune.workers=5001", "at most 5000"),
    ("pretrain.lr=1e23", "at most 10"),
    ("finetune.lrs=1e-3,1e23", "at most 10"),
    ("pretrain.straggler_factor=1e23", "at most 2147483647"),
    ("platform.workflow_deadline_s=100000000000000000000000", "at most 2147483647"),
    ("pretrain.seed=-100000000000000000000000", "at least 0"),
    ("pretrain.compression_level=-100000000000000000000000", "at least -7"),
    ("pretrain.max_steps=2147483648", "at most 2147483647"),
    ("pretrain.rank_resources.memory=lots", "Kubernetes quantity"),
    ("pretrain.rank_resources.cpu=1 core", "Kubernetes quantity"),
    ("pretrain.shm_size=big", "Kubernetes quantity"),
    ("pretrain.rank_resources.gpu=-1", "at least 0"),
    ("platform.workflow_deadline_s=-1", "at least 0"),
    ("retention.concurrency_policy=Sometimes", "Allow, Forbid, Replace"),
    ("retention.timezone=Mars/Base", "IANA time zone"),
    ("retention.policy=last=x", "last="),
    ("retention.schedules=hourly", "cron schedule"),
    ("name=My_Pipeline", "DNS label"),
    ("platform.namespace=Team A", "DNS label"),
    ("finetune.base_step=bestest", "best:METRIC"),
    ('platform.tolerations=[{"key":"a","operator":"Maybe"}]', "not one of Equal, Exists"),
    ('platform.tolerations=[{"key":"a","effect":"Never"}]', "NoSchedule"),
    ('platform.tolerations=[{"key":"a","operator":"Exists","value":"x"}]', "takes no value"),
    ('platform.tolerations=[{"key":"a","colour":"red"}]', "unknown toleration field"),
    ('platform.tolerations=[{"key":"a"', "not valid YAML/JSON"),
    ("platform.tolerations=[1]", "not a toleration"),
    ('platform.tolerations={"key":"a","tolerationSeconds":"soon"}', "whole number"),
    ('platform.tolerations={"key":"a","tolerationSeconds":5}', "NoExecute only"),
    ("platform.image=", "must not be empty"),
    ("platform.storage_root=", "must not be empty"),
    ("platform.outputs_dir=out", "absolute path"),
    ("platform.service_account=Bad_SA", "a Kubernetes name"),
    ("retention.name=Nightly GC", "a Kubernetes name"),
    ("platform.argo_ui=localhost:2746", "give a URL"),
    ("platform.node_selector=[1]", "mapping of labels"),
    ("platform.node_selector=pool", "label=value"),
    ('platform.node_selector={"bad key!": "x"}', "label key"),
    ("platform.gpu_node_selector=pool=no good", "label value"),
    ("platform.gpu_tolerations=[1]", "not a toleration"),
    ("platform.gpu_env=NCCL-DEBUG=INFO", "not a variable name"),
    ("platform.gpu_env=1ST=x", "not a variable name"),
    ("platform.gpu_env=NCCL_DEBUG", "NAME=VALUE"),
    ("platform.gpu_env=A=1,A=2", "named twice"),
    ("platform.gpu_env=[1]", "mapping of variables"),
    ("platform.gpu_extended_resources=rdma/ib=0", "whole count"),
    ("platform.gpu_pod_spec_patch=[1]", "mapping of Pod spec fields"),
    ("platform.gpu_pod_spec_patch={a: [}", "not valid YAML/JSON"),
    ("platform.gpu_pod_labels=team=ml team", "label value"),
    ("platform.gpu_pod_labels=-bad=x", "label key"),
    ("platform.gpu_pod_annotations=not a key!=x", "annotation key"),
    ('platform.gpu_pod_annotations={"a": "' + "x" * 16385 + '"}', "at most 16384"),
    ("platform.gpu_extended_resources=rdma/ib=500m", "whole count"),
    ("platform.gpu_extended_resources=nvidia.com/gpu=1", "extended resource"),
    ("platform.gpu_extended_resources=hugepages=1", "extended resource"),
    ("platform.gpu_extended_resources=bad domain!/ib=1", "extended resource"),
    ("platform.priority_class_name=High Priority", "a Kubernetes name"),
    ("platform.scheduler_name=Volcano!", "a Kubernetes name"),
    ("platform.gang_scheduler=slurm", "not one of none, kueue, volcano, coscheduling"),
    ("platform.gang_scheduler=Kueue", "not one of none, kueue, volcano, coscheduling"),
    ("platform.gang_queue=Team_A", "a Kubernetes name"),
    ("platform.gang_scheduler_name=My Scheduler", "a Kubernetes name"),
]


@pytest.mark.parametrize(("assignment", "allowed"), BAD_SETTINGS, ids=[b[0] for b in BAD_SETTINGS])
def test_a_bad_setting_is_one_line_naming_key_value_and_what_is_allowed(assignment, allowed):
    key, _, raw = assignment.partition("=")
    with pytest.raises(ConfigError) as info:
        apply_overrides(PipelineConfig(), [assignment])
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"--set {key}={raw}: "), message
    assert allowed in message


def test_tolerations_and_node_selectors_are_structured_values():
    cfg = apply_overrides(
        PipelineConfig(),
        [
            'platform.tolerations=[{"key":"nvidia.com/gpu","operator":"Exists"},'
            '{"key":"spot","value":"yes","effect":"NoExecute","tolerationSeconds":60}]',
            "platform.node_selector={pool: gpu, zone: a}",
        ],
    )
    assert cfg.platform.tolerations == (
        Toleration(key="nvidia.com/gpu", operator="Exists"),
        Toleration(key="spot", value="yes", effect="NoExecute", toleration_seconds=60),
    )
    assert cfg.platform.node_selector == (("pool", "gpu"), ("zone", "a"))
    # --keys shows them as JSON, which --set takes back.
    shown = dict(line.split(" = ", 1) for line in describe(obj=cfg))
    again = apply_overrides(
        PipelineConfig(),
        [f"platform.{k}={shown[f'platform.{k}']}" for k in ("tolerations", "node_selector")],
    )
    assert again.platform == cfg.platform


def test_validate_checks_settings_however_they_were_set():
    from ckptflow.workflows.config import validate

    validate(PipelineConfig())
    bad = dataclasses.replace(
        PipelineConfig(),
        platform=dataclasses.replace(PipelineConfig().platform, image_pull_policy="Sometimes"),
    )
    with pytest.raises(ConfigError, match="platform.image_pull_policy=Sometimes: not one of"):
        validate(bad)


def test_gpu_env_takes_a_mapping_and_python_values_are_checked_too():
    cfg = apply_overrides(PipelineConfig(), ['platform.gpu_env={"NCCL_DEBUG": "INFO", "N": 2}'])
    assert cfg.platform.gpu_env == (("NCCL_DEBUG", "INFO"), ("N", "2"))
    bad = dataclasses.replace(
        cfg, platform=dataclasses.replace(cfg.platform, gpu_env=(("NO-DASH", "x"),))
    )
    with pytest.raises(ConfigError, match=r"^--set platform\.gpu_env=.*not a variable name"):
        validate(bad)
    bad = dataclasses.replace(
        cfg, platform=dataclasses.replace(cfg.platform, gpu_node_selector=(("pool", "a b"),))
    )
    with pytest.raises(ConfigError, match="label value"):
        validate(bad)

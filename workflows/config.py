"""Configuration of every workflow ckptflow renders, with `--set key=value` overrides.

One tree, `PipelineConfig`, configures every builder: `platform` says where and how pods run
(image, namespace, identities, storage, MLflow, scheduling), and one section per stage says
what it does. Each builder reads the sections it needs, so `--set pretrain.ranks=4` means the
same thing to `ckptflow render pretrain` and to `ckptflow render pipeline`. The `platform`
section and the `Resources`/`Toleration` values are in platform_config.py.

A stage's step arguments are the step's own dataclass from `ckptflow.contract` (the one the
step parses), embedded with only what this workflow runs differently from the step's defaults;
the builders render it with `contract.to_argv`. Its fields are keys of the section
(`pretrain.max_steps`), except those the builders fill in themselves (`step_args(hide=...)`).

Only references and settings live here: credentials are named by their Kubernetes Secret
(`platform.s3_secret`, `platform.gcs_secret`, `platform.azure_secret`), never held.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace

from ckptflow.workflows import checks
from ckptflow.workflows.checks import ConfigError
from ckptflow.workflows.gang_scheduling import check_gang
from ckptflow.workflows.local_tier import check_local_tier
from ckptflow.workflows.platform_config import PlatformConfig, Resources, Toleration
from ckptflow.workflows.pod_checks import check_pods

from ckptflow.contract import (
    EvaluateArgs,
    FinetuneArgs,
    PretrainArgs,
    RdzvArgs,
    SelectArgs,
)

__all__ = ["ConfigError"]  # (and the dataclasses and functions below)


def step_args(default: object, *, hide: tuple[str, ...] = (), flat: bool = True):
    """A step's arguments (a `ckptflow.contract` dataclass) inside a section.

    `default` states only what this workflow runs differently from the step's own defaults,
    which stay in the contract. With `flat` its fields are set as `section.field` (e.g.
    `pretrain.max_steps`), otherwise as `section.name.field`. `hide` names the fields the
    builder fills in (Argo parameters, grid values) or that another step's flat arguments in
    the same section already name: `--set` cannot reach them.
    """
    return field(default=default, metadata={"flat": flat, "hide": frozenset(hide)})


# What a builder always fills in itself: Argo parameters and the outputs directory.
WIRED = ("run_root", "mlflow_parent_run_id", "output_dir")


@dataclass(frozen=True)
class PretrainConfig:
    """Distributed pretraining: N rank pods joined by a c10d rendezvous, plus the evaluator."""

    run_root: str = ""  # "" = <storage_root>/<workflow name>/pretrain; fixed = resumable
    # The ranks' `ckptflow.steps.pretrain` arguments, set as pretrain.KEY. The one recipe that
    # `ckptflow run pipeline --local` and `ckptflow submit pipeline` both run (issue 38): the
    # tiny model passes 0.5 exact match on held-out additions after about 450 of these steps
    # (tests/workflows/test_local_learning.py measures it on every CI run).
    train: PretrainArgs = step_args(
        PretrainArgs(
            run_root="", max_steps=800, batch_size=32, lr=5e-3, warmup_steps=20,
            ckpt_every=100, full_every=4, log_every=10,
        ),
        # local_size_mib: from platform.local_volume_size (one setting for the volume's size)
        hide=(*WIRED, "local_size_mib"),
    )  # fmt: skip
    # The background `ckptflow.steps.evaluate` (it follows the run), set as pretrain.evaluator.KEY.
    evaluator: EvaluateArgs = step_args(
        EvaluateArgs(run_root="", poll_seconds=5.0, timeout_seconds=24 * 3600.0),
        hide=(*WIRED, "step", "until_finished", "forever"),
        flat=False,
    )
    ranks: int = 2  # rank pods (torchrun nodes)
    procs_per_rank: int = 1  # processes per pod (GPUs per pod on GPU nodes)
    rdzv_port: int = RdzvArgs.port  # TCP port of the rendezvous store
    # how long ranks wait for each other to (re)join; also how long a surviving rank waits for
    # a lost one before it fails: short enough that a rank out of retries fails the workflow
    # within minutes, long enough for a retried pod to be rescheduled and start
    rdzv_join_timeout_s: int = 300
    max_restarts: int = 3  # in-pod restarts of the worker group (torchrun --max-restarts)
    retries: int = 3  # pod retries per rank; each resumes from the latest valid checkpoint
    retry_backoff_s: int = 10  # first retry delay (doubles each retry)
    timeout: str = ""  # rank pod timeout, e.g. 120h ("": none); per run -p pretrain_timeout=
    evaluator_timeout: str = ""  # the evaluators' timeout; per run -p evaluator_timeout=
    # retries avoid the nodes where the rank failed: needs a spare node per rank (retry_tweak.go)
    retry_elsewhere: bool = False
    grace_s: int = 120  # terminationGracePeriodSeconds of a rank pod: its preemption save
    # Defaults fit the README's laptop cluster (tests/deploy/test_resources.py sums them).
    rank_resources: Resources = Resources(cpu="1", memory="1536Mi")  # per rank pod
    shm_size: str = "1Gi"  # size of the /dev/shm emptyDir (dataloader and NCCL buffers)
    evaluator_resources: Resources = Resources(cpu="500m", memory="1Gi")  # evaluator pod


@dataclass(frozen=True)
class FinetuneConfig:
    """Fine-tune fan-out over a grid of variants, then `select` (fan-in, export, register)."""

    base_root: str = ""  # pretraining run root; "" = the pipeline's own (or a submit argument)
    run_root: str = ""  # "" = <storage_root>/<workflow name>; variants under finetune/<name>
    # Each variant's `ckptflow.steps.finetune` arguments, set as finetune.KEY (lr and
    # freeze_blocks come from the grid). Every block trains: with block 0 frozen `rev` stayed
    # at exact match 0 (200 steps at lr 1e-2 or 3e-3). The two lrs differ in outcome, not only
    # in degree (README's figures: 3e-3 answers every prompt, 1e-2 none), so select chooses.
    # The base's own task (`add`) is overwritten: replaying it in the data kept neither task.
    train: FinetuneArgs = step_args(
        FinetuneArgs(
            base_root="", run_root="", max_steps=600, batch_size=32, warmup_steps=10,
            ckpt_every=100, log_every=10,
        ),
        hide=(*WIRED, "base_root", "lr", "freeze_blocks"),
    )  # fmt: skip
    lrs: tuple[float, ...] = (1e-2, 3e-3)  # learning rates of the grid
    freeze_blocks: tuple[int, ...] = (0,)  # frozen leading blocks of the grid
    # `ckptflow.steps.select`'s arguments, set as finetune.KEY (its experiment is the variants').
    select: SelectArgs = step_args(
        SelectArgs(candidates="", dtype="bf16", model_name="ckptflow-tiny"),
        hide=(*WIRED, "candidates", "export_uri", "experiment"),
    )
    workers: int = 1  # processes per variant pod (M, fewer than the pretraining ranks)
    retries: int = 2  # pod retries per variant
    retry_backoff_s: int = 10  # first retry delay (doubles each retry)
    timeout: str = ""  # variant pod timeout, e.g. 24h ("": none); per run -p finetune_timeout=
    retry_elsewhere: bool = False  # retries avoid the nodes where the variant failed
    grace_s: int = 120  # terminationGracePeriodSeconds of a variant pod: its preemption save
    resources: Resources = Resources(cpu="1", memory="1536Mi")  # per variant pod (in parallel)
    shm_size: str = "1Gi"  # size of the /dev/shm emptyDir


@dataclass(frozen=True)
class RetentionConfig:
    """A CronWorkflow that garbage-collects checkpoint roots by a retention policy."""

    name: str = "ckptflow-retention"  # CronWorkflow name
    schedules: tuple[str, ...] = ("17 * * * *",)  # cron schedules (Argo v4 `schedules`)
    timezone: str = "UTC"  # timezone of the schedules
    # checkpoint roots; () = every root the pipelines write under platform.storage_root
    # (NAME/pretrain/ckpt, NAME/finetune/VARIANT/ckpt), found at each run (ckptflow ckpt roots)
    roots: tuple[str, ...] = ()
    policy: str = "2h:all,1d:1h,7d:1d,*:7d"  # `ckptflow ckpt gc --policy` spec
    concurrency_policy: str = "Forbid"  # Allow | Forbid | Replace
    starting_deadline_s: int = 600  # a missed schedule older than this is skipped
    history_limit: int = 3  # finished workflows kept, successful and failed each
    deadline_s: int = 3600  # activeDeadlineSeconds of one gc pod
    retries: int = 2  # pod retries (gc is resumable)
    drill_newest: int = 2  # drill: read every byte of the newest N steps first (0: no drill)
    drill_test_load: bool = True  # drill: load the latest valid step into its model


@dataclass(frozen=True)
class EvaluateConfig:
    """A WorkflowTemplate evaluating one checkpoint, triggered by MinIO commit events."""

    template_name: str = "ckptflow-evaluate"  # WorkflowTemplate name
    event_source_name: str = "ckptflow-minio"  # Argo Events EventSource name
    sensor_name: str = "ckptflow-evaluate-on-commit"  # Argo Events Sensor name
    sensor_service_account: str = "ckptflow-sensor"  # may create workflows in the namespace
    marker: str = "COMMIT"  # commit marker file inside step-XXXXXXXX/
    events: tuple[str, ...] = ("s3:ObjectCreated:*",)  # MinIO bucket notification events
    minio_insecure: bool = True  # plain HTTP to MinIO (in-cluster)
    # The pod's `ckptflow.steps.evaluate` arguments (one step: no polling), set as evaluate.KEY.
    evaluator: EvaluateArgs = step_args(
        EvaluateArgs(run_root=""),
        hide=(*WIRED, "step", "until_finished", "forever", "poll_seconds", "timeout_seconds"),
    )
    retries: int = 2  # pod retries
    deadline_s: int = 3600  # activeDeadlineSeconds of the evaluation pod
    resources: Resources = Resources(cpu="1", memory="2Gi")  # evaluation pod


@dataclass(frozen=True)
class PipelineConfig:
    """The whole tree: every builder takes it and reads the sections it needs."""

    name: str = "ckptflow"  # generateName prefix of the workflows
    platform: PlatformConfig = field(default_factory=PlatformConfig)  # where pods run
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)  # pretraining stage
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)  # fine-tune stage
    retention: RetentionConfig = field(default_factory=RetentionConfig)  # retention cron
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)  # event-driven eval


# ---------------------------------------------------------------------------- overrides


@dataclass(frozen=True)
class Setting:
    """One `--set` key: where it lives in the tree and its type (a section: a dataclass)."""

    key: str  # dotted, as --set takes it: "pretrain.max_steps"
    path: tuple[str, ...]  # attributes from the root: ("pretrain", "train", "max_steps")
    type: object  # the field's type
    section: bool  # a dataclass: its fields are the keys below it
    meta: typing.Mapping = field(default_factory=dict)  # the field's metadata (contract bounds)


def _walk(cls: type, prefix: str = "", path: tuple[str, ...] = (), hide=frozenset()):
    """Every Setting under `cls`; flat step arguments count as their section's own keys."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if f.name in hide:
            continue
        tp, at = hints[f.name], (*path, f.name)
        if not is_dataclass(tp):
            yield Setting(prefix + f.name, at, tp, False, f.metadata)
            continue
        if f.metadata.get("flat"):
            yield from _walk(tp, prefix, at, f.metadata["hide"])
            continue
        yield Setting(prefix + f.name, at, tp, True)
        yield from _walk(tp, f"{prefix}{f.name}.", at, f.metadata.get("hide", frozenset()))


def settings(cls: type = PipelineConfig) -> dict[str, Setting]:
    """Every key under `cls` (sections included), in field order; a key named twice raises."""
    out: dict[str, Setting] = {}
    for s in _walk(cls):
        if s.key in out:
            raise TypeError(f"{cls.__name__}: {s.key} is named twice; hide one of them")
        out[s.key] = s
    return out


def setting_keys(cls: type = PipelineConfig) -> list[str]:
    """Every dotted key `--set` accepts under `cls`."""
    return [k for k, s in settings(cls).items() if not s.section]


def value_at(obj: object, path: tuple[str, ...]) -> object:
    for name in path:
        obj = getattr(obj, name)
    return obj


def _replace_at(obj: object, path: tuple[str, ...], value: object) -> object:
    if len(path) == 1:
        return replace(obj, **{path[0]: value})
    return replace(obj, **{path[0]: _replace_at(getattr(obj, path[0]), path[1:], value)})


NODE_SELECTOR = tuple[tuple[str, str], ...]
TOLERATIONS = tuple[Toleration, ...]


def _convert(key: str, raw: str, tp: object) -> object:
    """Turn the text of `--set key=raw` into the field's type, or explain what was expected."""
    if key in checks.ENV_SETTINGS:
        return checks.env_from_text(key, raw)
    if key in checks.ANNOTATION_SETTINGS:
        return checks.annotations_from_text(key, raw)
    if key in checks.RESOURCE_SETTINGS:
        return checks.resources_from_text(key, raw)
    if tp == NODE_SELECTOR:
        return checks.node_selector_from_text(key, raw)
    if tp == TOLERATIONS:
        return checks.tolerations_from_text(key, raw, Toleration)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if raw.lower() in ("", "none", "null") else _convert(key, raw, args[0])
    if origin is tuple:
        item = typing.get_args(tp)[0]
        parts = [p.strip() for p in raw.split(",")] if raw.strip() else []
        return tuple(_convert(key, p, item) for p in parts)
    if tp is bool:
        low = raw.strip().lower()
        if low in ("true", "yes", "1", "on"):
            return True
        if low in ("false", "no", "0", "off"):
            return False
        raise ConfigError(f"--set {key}={raw}: expected true or false")
    if tp in (int, float):
        try:
            return tp(raw)
        except ValueError:
            raise ConfigError(f"--set {key}={raw}: expected {tp.__name__}") from None
    return raw.strip() if tp is str and raw != raw.strip() else raw


def apply_overrides(cfg: PipelineConfig, assignments: typing.Iterable[str]) -> PipelineConfig:
    """Return `cfg` with each "dotted.key=value" applied; unknown keys raise ConfigError.

    Lists are comma-separated (`--set finetune.lrs=1e-3,3e-4`), booleans true/false,
    tolerations and node selectors YAML/JSON. Each value is checked (`ckptflow.workflows.
    checks`): a bad one raises ConfigError naming the key, the value and what is allowed.
    """
    known = settings(type(cfg))
    for assignment in assignments:
        key, sep, raw = assignment.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE, e.g. pretrain.ranks=4")
        s = known.get(key)
        if s is None:
            leaves = setting_keys(type(cfg))
            close = difflib.get_close_matches(key, leaves, n=3)
            hint = f"did you mean {', '.join(close)}?" if close else "see `ckptflow render --keys`"
            raise ConfigError(f"--set {key}: unknown setting; {hint}")
        if s.section:
            subkeys = ", ".join(k for k in setting_keys(type(cfg)) if k.startswith(f"{key}."))
            raise ConfigError(f"--set {key}: is a section; set one of {subkeys}")
        value = _convert(key, raw, s.type)
        checks.check(key, value, s.meta, shown=raw)
        cfg = _replace_at(cfg, s.path, value)
    return cfg


def validate(cfg: object) -> None:
    """Raise ConfigError for the first setting of `cfg` that is not allowed (however it was
    set: `--set`, a builder's defaults, Python), before anything is rendered."""
    for key, s in settings(type(cfg)).items():
        if not s.section:
            checks.check(
                key, value_at(cfg, s.path), s.meta, shown=shown_value(value_at(cfg, s.path))
            )
    if isinstance(cfg, PipelineConfig):
        check_pods(cfg)  # settings that must fit together in one pod
        check_gang(cfg.platform)  # gang settings that must go together
        check_local_tier(cfg)  # the local checkpoint tier's volume, size and replicas


def shown_value(value: object) -> str:
    """A setting's value as `--set` takes it back (structured values as JSON)."""
    if isinstance(value, tuple) and value and isinstance(value[0], Toleration):
        return json.dumps([_toleration_json(t) for t in value], separators=(",", ":"))
    if isinstance(value, tuple) and value and isinstance(value[0], tuple):
        return json.dumps(dict(value), separators=(",", ":"))
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def _toleration_json(t: Toleration) -> dict:
    names = {"toleration_seconds": "tolerationSeconds"}
    return {names.get(k, k): v for k, v in asdict(t).items() if v not in ("", None)}


def as_tree(cfg: object) -> dict:
    """Every setting's value, nested by its key (what `--set` sees; lists for tuples)."""
    tree: dict = {}
    for key, s in settings(type(cfg)).items():
        if s.section:
            continue
        *sections, name = key.split(".")
        node = tree
        for part in sections:
            node = node.setdefault(part, {})
        value = value_at(cfg, s.path)
        if isinstance(value, tuple) and value and isinstance(value[0], Toleration | tuple):
            value = json.loads(shown_value(value))  # tolerations, node selector: structured
        node[name] = list(value) if isinstance(value, tuple) else value
    return tree


def describe(cls: type = PipelineConfig, obj: object | None = None) -> list[str]:
    """`key = value` lines for every setting (for `ckptflow render --keys`)."""
    obj = cls() if obj is None else obj
    lines: list[str] = []
    for key, s in settings(cls).items():
        if s.section:
            continue
        lines.append(f"{key} = {shown_value(value_at(obj, s.path))}")
    return lines

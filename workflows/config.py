"""Configuration of every workflow ckptflow renders, with `--set key=value` overrides.

One tree, `PipelineConfig`, configures every builder: `platform` says where and how pods run
(image, namespace, identities, storage, MLflow, scheduling), and one section per stage says
what it does. Each builder reads the sections it needs, so `--set pretrain.ranks=4` means the
same thing to `ckptflow render pretrain` and to `ckptflow render pipeline`.

Only references and settings live here: credentials are named by their Kubernetes Secret
(`platform.s3_secret`), never held.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field, fields, is_dataclass, replace


class ConfigError(ValueError):
    """A user-supplied setting is unknown or malformed; the message names the fix."""


@dataclass(frozen=True)
class Resources:
    """Kubernetes resources of one pod's main container (quantities as strings)."""

    cpu: str = "1"  # CPU request, e.g. "2" or "500m"
    memory: str = "2Gi"  # memory request and limit (a limit stops one pod starving a node)
    gpu: int = 0  # nvidia.com/gpu count (request == limit); 0 requests none


@dataclass(frozen=True)
class PlatformConfig:
    """Where and how pods run: image, namespace, identities, storage, MLflow, scheduling."""

    image: str = "ckptflow-steps:0.1.0"  # step image: contains `steps` and the `ckptflow` CLI
    image_pull_policy: str = "IfNotPresent"  # Always | IfNotPresent | Never
    namespace: str = "ckptflow"  # namespace the workflows run in
    service_account: str = "ckptflow-workflow"  # service account of every pod
    storage_root: str = "s3://ckptflow/runs"  # URI under which each run gets its own prefix
    mlflow_tracking_uri: str = "http://mlflow.ckptflow.svc.cluster.local:5000"  # MLflow server
    experiment: str = "ckptflow"  # MLflow experiment of the pipeline's parent runs
    s3_endpoint: str = "http://minio.ckptflow.svc.cluster.local:9000"  # "" = AWS S3 itself
    s3_secret: str = "ckptflow-s3"  # Secret holding the S3 keys; "" = no key env (local runs)
    s3_access_key_key: str = "AWS_ACCESS_KEY_ID"  # key of the access key id in that Secret
    s3_secret_key_key: str = "AWS_SECRET_ACCESS_KEY"  # key of the secret access key in it
    s3_region: str = "us-east-1"  # AWS_DEFAULT_REGION of every pod
    node_selector: tuple[str, ...] = ()  # "key=value" labels every pod's node must carry
    tolerations: tuple[str, ...] = ()  # "key[=value]:Effect"; no value means operator Exists
    pod_gc: str = "OnPodSuccess"  # podGC strategy; "" keeps every pod
    workflow_deadline_s: int = 2 * 24 * 3600  # activeDeadlineSeconds of each workflow
    ttl_after_completion_s: int = 7 * 24 * 3600  # delete finished workflows after this long
    outputs_dir: str = "/tmp/outputs"  # --output-dir of each step; files there are outputs
    argo_ui: str = "https://localhost:2746"  # Argo Server URL for links and `submit`
    step_resources: Resources = Resources(cpu="250m", memory="1Gi")  # small bookkeeping steps


@dataclass(frozen=True)
class PretrainConfig:
    """Distributed pretraining: N rank pods joined by a c10d rendezvous, plus the evaluator."""

    run_root: str = ""  # "" = <storage_root>/<workflow name>/pretrain; fixed = resumable
    ranks: int = 2  # rank pods (torchrun nodes)
    procs_per_rank: int = 1  # processes per pod (GPUs per pod on GPU nodes)
    model: str = "tiny"  # model size name
    task: str = "add"  # generated pretraining task (add, sub, mul, rev, sort)
    max_steps: int = 200  # optimizer steps
    batch_size: int = 8  # global sequences per optimizer step
    seq_len: int = 64  # sequence length
    lr: float = 3e-3  # peak learning rate
    warmup_steps: int = 20  # linear warmup steps
    grad_accum: int = 1  # gradient accumulation micro-steps
    ckpt_every: int = 20  # checkpoint every K steps
    full_every: int = 4  # every F-th checkpoint is full, the others deltas
    async_save: bool = True  # write checkpoints in the background
    seed: int = 0  # seed of data and initialisation
    rdzv_port: int = 29400  # TCP port of the rendezvous store
    rdzv_join_timeout_s: int = 600  # how long ranks wait for each other to join
    max_restarts: int = 3  # in-pod restarts of the worker group (torchrun --max-restarts)
    retries: int = 3  # pod retries per rank; each resumes from the latest valid checkpoint
    retry_backoff_s: int = 10  # first retry delay (doubles each retry)
    rank_deadline_s: int = 24 * 3600  # activeDeadlineSeconds of one rank pod
    rank_resources: Resources = Resources(cpu="2", memory="4Gi")  # per rank pod
    shm_size: str = "1Gi"  # size of the /dev/shm emptyDir (dataloader and NCCL buffers)
    eval_poll_s: int = 5  # evaluator polling interval
    eval_timeout_s: int = 24 * 3600  # evaluator gives up after this long
    evaluator_resources: Resources = Resources(cpu="1", memory="2Gi")  # evaluator pod


@dataclass(frozen=True)
class FinetuneConfig:
    """Fine-tune fan-out over a grid of variants, then `select` (fan-in, export, register)."""

    base_root: str = ""  # pretraining run root; "" = the pipeline's own (or a submit argument)
    base_step: str = "latest"  # latest | best:METRIC | N
    run_root: str = ""  # "" = <storage_root>/<workflow name>; variants under finetune/<name>
    task: str = "rev"  # fine-tuning task: a different generated task than pretraining
    lrs: tuple[float, ...] = (1e-3, 3e-4)  # learning rates of the grid
    freeze_blocks: tuple[int, ...] = (1,)  # frozen leading blocks of the grid
    workers: int = 1  # processes per variant pod (M, fewer than the pretraining ranks)
    max_steps: int = 40  # optimizer steps per variant
    ckpt_every: int = 20  # checkpoint every K steps
    seed: int = 0  # seed of data and initialisation
    retries: int = 2  # pod retries per variant
    retry_backoff_s: int = 10  # first retry delay (doubles each retry)
    deadline_s: int = 12 * 3600  # activeDeadlineSeconds of one variant pod
    resources: Resources = Resources(cpu="2", memory="4Gi")  # per variant pod
    shm_size: str = "1Gi"  # size of the /dev/shm emptyDir
    metric: str = "val_loss"  # evaluation metric select ranks by (val_loss, exact_match)
    mode: str = "min"  # min | max
    dtype: str = "bf16"  # dtype of the exported weights: fp32 | bf16
    model_name: str = "ckptflow-tiny"  # registered MLflow model name
    force: bool = False  # let a worse candidate displace the champion


@dataclass(frozen=True)
class RetentionConfig:
    """A CronWorkflow that garbage-collects checkpoint roots by a retention policy."""

    name: str = "ckptflow-retention"  # CronWorkflow name
    schedules: tuple[str, ...] = ("17 * * * *",)  # cron schedules (Argo v4 `schedules`)
    timezone: str = "UTC"  # timezone of the schedules
    roots: tuple[str, ...] = ()  # checkpoint roots; () = <storage_root>/main/pretrain/ckpt
    policy: str = "2h:all,1d:1h,7d:1d,*:7d"  # `ckptflow ckpt gc --policy` spec
    concurrency_policy: str = "Forbid"  # Allow | Forbid | Replace
    starting_deadline_s: int = 600  # a missed schedule older than this is skipped
    history_limit: int = 3  # finished workflows kept, successful and failed each
    deadline_s: int = 3600  # activeDeadlineSeconds of one gc pod
    retries: int = 2  # pod retries (gc is resumable)


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


def setting_keys(cls: type = PipelineConfig, prefix: str = "") -> list[str]:
    """Every dotted key `--set` accepts under `cls`."""
    keys: list[str] = []
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        tp = hints[f.name]
        if is_dataclass(tp):
            keys += setting_keys(tp, f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def _convert(key: str, raw: str, tp: object) -> object:
    """Turn the text of `--set key=raw` into the field's type, or explain what was expected."""
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
    return raw


def _set(cfg: object, path: list[str], raw: str, full_key: str) -> object:
    hints = typing.get_type_hints(type(cfg))
    name = path[0]
    if name not in hints:
        raise KeyError(name)
    tp = hints[name]
    if len(path) == 1:
        if is_dataclass(tp):
            subkeys = ", ".join(setting_keys(tp, f"{full_key}."))
            raise ConfigError(f"--set {full_key}: is a section; set one of {subkeys}")
        return replace(cfg, **{name: _convert(full_key, raw, tp)})
    if not is_dataclass(tp):
        raise KeyError(name)
    return replace(cfg, **{name: _set(getattr(cfg, name), path[1:], raw, full_key)})


def apply_overrides(cfg: PipelineConfig, assignments: typing.Iterable[str]) -> PipelineConfig:
    """Return `cfg` with each "dotted.key=value" applied; unknown keys raise ConfigError.

    Lists are comma-separated (`--set finetune.lrs=1e-3,3e-4`), booleans true/false.
    """
    for assignment in assignments:
        key, sep, raw = assignment.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE, e.g. pretrain.ranks=4")
        try:
            cfg = _set(cfg, key.split("."), raw, key)
        except KeyError:
            known = setting_keys(type(cfg))
            close = difflib.get_close_matches(key, known, n=3)
            hint = f"did you mean {', '.join(close)}?" if close else "see `ckptflow render --keys`"
            raise ConfigError(f"--set {key}: unknown setting; {hint}") from None
    return cfg


def describe(cls: type = PipelineConfig, obj: object | None = None, prefix: str = "") -> list[str]:
    """`key = value` lines for every setting (for `ckptflow render --keys`)."""
    obj = cls() if obj is None else obj
    lines: list[str] = []
    for f in dataclasses.fields(cls):
        value = getattr(obj, f.name)
        if is_dataclass(value):
            lines += describe(type(value), value, f"{prefix}{f.name}.")
        else:
            shown = ",".join(map(str, value)) if isinstance(value, tuple) else value
            lines.append(f"{prefix}{f.name} = {shown}")
    return lines

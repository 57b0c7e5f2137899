"""Configuration of every workflow ckptflow renders, with `--set key=value` overrides.

One tree, `PipelineConfig`, configures every builder: `platform` says where and how pods run
(image, namespace, identities, storage, MLflow, scheduling), and one section per stage says
what it does. Each builder reads the sections it needs, so `--set pretrain.ranks=4` means the
same thing to `ckptflow render pretrain` and to `ckptflow render pipeline`.

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
from ckptflow.workflows.pod_checks import check_pods

from ckptflow.contract import (
    EXPERIMENT,
    EvaluateArgs,
    FinetuneArgs,
    PretrainArgs,
    RdzvArgs,
    SelectArgs,
)

__all__ = ["ConfigError"]  # (and the dataclasses and functions below)


@dataclass(frozen=True)
class Resources:
    """Kubernetes resources of one pod's main container (quantities as strings)."""

    cpu: str = "1"  # CPU request, e.g. "2" or "500m"
    memory: str = "2Gi"  # memory request and limit (a limit stops one pod starving a node)
    gpu: int = 0  # nvidia.com/gpu count (request == limit); 0 requests none


@dataclass(frozen=True)
class Toleration:
    """One Kubernetes toleration of every pod (the Pod API's fields)."""

    key: str = ""  # taint key ("" with operator Exists: every taint)
    operator: str = "Equal"  # Equal | Exists
    value: str = ""  # taint value (operator Equal)
    effect: str = ""  # "" (every effect) | NoSchedule | PreferNoSchedule | NoExecute
    toleration_seconds: int | None = None  # NoExecute only: how long the pod stays


@dataclass(frozen=True)
class PlatformConfig:
    """Where and how pods run: image, namespace, identities, storage, MLflow, scheduling."""

    image: str = "ckptflow-steps:0.1.0"  # step image: contains `steps` and the `ckptflow` CLI
    image_pull_policy: str = "IfNotPresent"  # Always | IfNotPresent | Never
    namespace: str = "ckptflow"  # namespace the workflows run in
    service_account: str = "ckptflow-workflow"  # service account of every pod
    storage_root: str = "s3://ckptflow/runs"  # URI under which each run gets its own prefix
    mlflow_tracking_uri: str = "http://mlflow.ckptflow.svc.cluster.local:5000"  # MLflow server
    experiment: str = EXPERIMENT  # MLflow experiment of the pipeline's parent runs
    s3_endpoint: str = "http://minio.ckptflow.svc.cluster.local:9000"  # "" = AWS S3 itself
    s3_secret: str = "ckptflow-s3"  # Secret holding the S3 keys; "" = no key env (local runs)
    s3_access_key_key: str = "AWS_ACCESS_KEY_ID"  # key of the access key id in that Secret
    s3_secret_key_key: str = "AWS_SECRET_ACCESS_KEY"  # key of the secret access key in it
    s3_region: str = "us-east-1"  # AWS_DEFAULT_REGION of every pod
    # gs://: a Secret holding a service-account key file, mounted read-only and named by
    # GOOGLE_APPLICATION_CREDENTIALS; "" = none (GKE workload identity, or no GCS)
    gcs_secret: str = ""
    gcs_secret_file: str = "key.json"  # key of the key file in that Secret
    # az://: a Secret holding the storage account's connection string (or its account key
    # with `azure_account_name`); "" = none (managed identity, or no Azure)
    azure_secret: str = ""
    azure_secret_key: str = "AZURE_STORAGE_CONNECTION_STRING"  # key of the credential in it
    azure_account_name: str = (
        ""  # set: the Secret holds that account's key, not a connection string
    )
    # Labels every pod's node must carry: a mapping {"pool": "gpu"} (or pool=gpu,zone=a).
    node_selector: tuple[tuple[str, str], ...] = ()
    # Tolerations of every pod: a YAML/JSON list as in a Pod spec (or key[=value]:Effect,...).
    tolerations: tuple[Toleration, ...] = ()
    # Rank and fine-tune (GPU) pods only: set, they use these instead of node_selector /
    # tolerations (Argo: a template's own replace the workflow's), so light steps (evaluator,
    # select, register, start/finish) keep to node_selector and off tainted GPU nodes.
    gpu_node_selector: tuple[tuple[str, str], ...] = ()
    gpu_tolerations: tuple[Toleration, ...] = ()
    # Rank and fine-tune pods tolerate node.kubernetes.io/unreachable and not-ready (NoExecute)
    # this long: a silently lost node's pods are evicted (and retried) this long after it turns
    # NotReady; 0 leaves Kubernetes' default, 300 s (DefaultTolerationSeconds admission plugin).
    gpu_node_loss_toleration_s: int = 60
    # The cluster's kube-controller-manager --node-monitor-grace-period (50 s since v1.32): a
    # silent node turns NotReady this long after its last heartbeat. For the planner's RTO and
    # as the floor of gpu_node_loss_toleration_s (a shorter one evicts on a kubelet hiccup).
    node_monitor_grace_s: int = 50
    # Extra env of rank and fine-tune pods, e.g. NCCL_IB_HCA=mlx5,NCCL_DEBUG=INFO (or a mapping).
    gpu_env: tuple[tuple[str, str], ...] = ()
    # Extended resources of each rank and fine-tune pod (request == limit), e.g. rdma/ib=1.
    gpu_extended_resources: tuple[tuple[str, str], ...] = ()
    gpu_pod_labels: tuple[tuple[str, str], ...] = ()  # labels of rank and fine-tune pods
    # Annotations of rank and fine-tune pods, e.g. {"k8s.v1.cni.cncf.io/networks": "ib0"}.
    gpu_pod_annotations: tuple[tuple[str, str], ...] = ()
    # Rank and fine-tune pods on the node's network (RDMA without Multus): leaves the restricted
    # Pod Security Standard (render says so); the namespace must allow it.
    gpu_host_network: bool = False
    # A podSpecPatch (YAML/JSON mapping) for rank and fine-tune pods, merged over ours.
    gpu_pod_spec_patch: str = ""
    # Gang scheduling of the pretraining ranks (all start or none): none | kueue | volcano |
    # coscheduling, rendered on the rank pods only (workflows/gang_scheduling.py)
    gang_scheduler: str = "none"
    # Kueue's LocalQueue ("" = ckptflow, deploy/gang/kueue's) or Volcano's Queue ("" = default)
    gang_queue: str = ""
    # the ranks' schedulerName ("" = volcano / scheduler-plugins-scheduler for coscheduling)
    gang_scheduler_name: str = ""
    # The local checkpoint tier's volume on rank pods (issue 35), mounted at pretrain.local_dir
    # only when pretrain.local_every > 0 (workflows/local_tier.py): emptyDir (default: per pod,
    # gone with it; a rank restarted by torchrun in its pod keeps it, a retried pod gets a new
    # one and fetches its piece from a peer) | hostPath (per node, outlives the pod; leaves the
    # restricted and baseline Pod Security Standards: the namespace must allow it)
    local_volume: str = "emptyDir"
    # its size, a Kubernetes quantity (e.g. 8Gi): the emptyDir's sizeLimit and the ranks'
    # --local-size-mib (local retention keeps within it); "" = no limit (the volume's free space)
    local_volume_size: str = ""
    # "" (the node's disk) | Memory (tmpfs: counts against rank_resources.memory, needs a size)
    local_volume_medium: str = ""
    # hostPath only: the node's directory (type Directory: it must exist on every GPU node,
    # writable by run_as_user); runs keep apart by run key below it
    local_host_path: str = "/var/lib/ckptflow/local"
    priority_class_name: str = ""  # PriorityClass of every pod (a Kubernetes name); "" = default
    scheduler_name: str = ""  # scheduler of every pod, e.g. volcano; "" = default-scheduler
    pod_gc: str = "OnPodSuccess"  # podGC strategy; "" keeps every pod
    # activeDeadlineSeconds of each workflow, 0 = none (an integer field: no parameter reaches it)
    workflow_deadline_s: int = 0
    run_as_user: int = 1000  # the non-root UID every pod runs as (images/step.Dockerfile's user)
    ttl_after_completion_s: int = 7 * 24 * 3600  # delete finished workflows after this long
    outputs_dir: str = "/tmp/outputs"  # --output-dir of each step; files there are outputs
    argo_ui: str = "http://localhost:2746"  # Argo Server URL for links and `submit`
    step_resources: Resources = Resources(cpu="250m", memory="1Gi")  # small bookkeeping steps


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

"""What each `--set` setting may be: parsed from its text, then checked, before any rendering.

A mistake is one `ConfigError` line naming the key, the bad value and what is allowed
(`--set platform.image_pull_policy=Sometimes: not one of Always, IfNotPresent, Never`), so no
invalid manifest is rendered with exit 0 and no Hera or Kubernetes traceback reaches a user.

Rules come from three places: the contract's own bounds of a step argument (`choices`,
`at_least`), the Kubernetes and Argo enums and formats of the platform settings (`ENUMS`,
quantities, labels, tolerations), and ranges by field name (`AT_LEAST`, `PORTS`).
Tolerations and node selectors are structured values (YAML or JSON, as in a Pod spec); the short
forms `key[=value]:Effect,...` and `key=value,...` are read too.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import yaml

from ckptflow import env as wiring

__all__ = [
    "ConfigError",
    "check",
    "node_selector_from_text",
    "quantity",
    "tolerations_from_text",
]


class ConfigError(ValueError):
    """A user-supplied setting is unknown or malformed; the message names the fix."""


ENUMS: dict[str, tuple[str, ...]] = {
    "platform.image_pull_policy": ("Always", "IfNotPresent", "Never"),
    "platform.pod_gc": (
        "",
        "OnPodCompletion",
        "OnPodSuccess",
        "OnWorkflowCompletion",
        "OnWorkflowSuccess",
    ),
    "retention.concurrency_policy": ("Allow", "Forbid", "Replace"),
    "platform.gang_scheduler": ("none", "kueue", "volcano", "coscheduling"),  # gang_scheduling.py
}
# The smallest value of a number, by field name (the contract's own `at_least` comes first).
AT_LEAST: dict[str, float] = {
    "run_as_user": 1,  # runAsNonRoot refuses UID 0
    "ranks": 1,
    "procs_per_rank": 1,
    "workers": 1,
    "gpu": 0,
    "retries": 0,
    "max_restarts": 0,
    "history_limit": 0,
    "batch_size": 1,
    "grad_accum": 1,
    "log_every": 1,
    "eval_batches": 1,
    "eval_batch_size": 1,
    "exact_match_n": 0,
    "warmup_steps": 0,
    "seq_len": 0,
    "seed": 0,
    "fail_at_step": 0,
    "grad_clip": 0,
    "weight_decay": 0,
    "dropout": 0,
    "min_lr_ratio": 0,
    "compression_level": -7,
    "poll_seconds": 0.01,
    "timeout_seconds": 0,
    "claim_ttl_seconds": 0,
}
# The largest value of a number, by field name; every other number is at most NUMBER_CEILING.
AT_MOST: dict[str, float] = {
    "dropout": 1,
    "min_lr_ratio": 1,
    "compression_level": 22,
    # pods of one job: Kubernetes supports clusters of up to 5,000 nodes (kubernetes.io,
    # "Considerations for large clusters"), one rank (variant worker) pod per node
    "ranks": 5000,
    "workers": 5000,
}
# Every number of a setting fits a signed 32-bit integer, the width of the Kubernetes and Argo
# fields it reaches (a port, a retry limit, a count of pods, seconds): `pretrain.ranks=10**23`
# was rendered as is. A learning rate is at most LR_CEILING.
NUMBER_CEILING = 2**31 - 1
LR_CEILING = 10.0
PORTS = ("rdzv_port",)
QUANTITIES = ("cpu", "memory", "shm_size")  # "" for shm_size: no /dev/shm volume
_QUANTITY = re.compile(
    r"[+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?"
)
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # a Kubernetes object name
# Settings that are Kubernetes object names (a label for those used as generateName prefixes).
OBJECT_NAMES = (
    "platform.priority_class_name",
    "platform.scheduler_name",
    "platform.gang_queue",
    "platform.gang_scheduler_name",
    "platform.service_account",
    "platform.s3_secret",
    "retention.name",
    "evaluate.template_name",
    "evaluate.event_source_name",
    "evaluate.sensor_name",
    "evaluate.sensor_service_account",
)
REQUIRED = ("platform.image", "platform.storage_root", "platform.experiment")
URLS = ("platform.argo_ui",)
_LABEL_NAME = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)")
_LABEL_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
# An eval.json metric: MLflow logs it by name, and refuses one that could resolve to another
# as a path (mlflow/utils/validation.py path_not_unique: '..', '//', a leading '/').
_METRIC = re.compile(r"(?=.{1,250}$)[A-Za-z0-9_-]+(?:[./][A-Za-z0-9_-]+)*")
_BASE_STEP = re.compile(r"latest|[0-9]{1,18}|best:[A-Za-z0-9_./-]+(:(min|max))?")
# Template `timeout`s: "" (none), whole seconds, or a Go duration, which is what Argo parses
# (wfv1.ParseStringToDuration: strconv.Atoi, else time.ParseDuration; no days).
TIMEOUTS = ("timeout", "evaluator_timeout")
_TIMEOUT = re.compile(r"[0-9]{1,12}|(?:[0-9]{1,12}(?:\.[0-9]+)?(?:h|m|s|ms|us|ns))+")
TOLERATION_OPERATORS = ("Equal", "Exists")
TOLERATION_EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")


def _bad(key: str, value: Any, why: str) -> ConfigError:
    shown = value if isinstance(value, str) else _text(value)
    return ConfigError(f"--set {key}={shown}: {why}")


def _text(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def _one_of(allowed: tuple) -> str:
    return "not one of " + ", ".join(repr(a) if a == "" else str(a) for a in allowed)


def quantity(text: str) -> bool:
    """Whether `text` is a Kubernetes quantity ("500m", "2", "1.5Gi", "1e3")."""
    return bool(_QUANTITY.fullmatch(text))


def _label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    return bool(_LABEL_NAME.fullmatch(name)) and (
        not prefix or bool(_LABEL_PREFIX.fullmatch(prefix))
    )


def _structured(key: str, raw: str) -> Any:
    """A YAML/JSON value, or the `raw` text itself when it is not one (the short form)."""
    text = raw.strip()
    if not text.startswith(("[", "{")):
        return None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem", None) or "malformed"
        raise ConfigError(f"--set {key}={raw}: not valid YAML/JSON ({where})") from None


# -- node selector -----------------------------------------------------------------------------
def node_selector_from_text(key: str, raw: str) -> tuple[tuple[str, str], ...]:
    """`{"pool": "gpu"}` (YAML/JSON) or `pool=gpu,zone=a` as (label, value) pairs."""
    pairs = _pairs_from_text(key, raw, "label=value", 'a mapping of labels, e.g. {"pool": "gpu"}')
    for pair in pairs:
        _check_pair(key, raw, pair)
    return pairs


def _pairs_from_text(key: str, raw: str, form: str, mapping: str) -> tuple[tuple[str, str], ...]:
    """A YAML/JSON mapping, or `a=b,c=d`, as (name, value) pairs (not yet checked)."""
    value = _structured(key, raw)
    if value is None:
        pairs = []
        for entry in (p.strip() for p in raw.split(",") if p.strip()):
            name, sep, val = entry.partition("=")
            if not sep:
                raise _bad(key, raw, f"{entry!r} is not {form}; or give a mapping")
            pairs.append((name.strip(), val.strip()))
    elif isinstance(value, dict):
        pairs = [(str(k), "" if v is None else _scalar(key, raw, v)) for k, v in value.items()]
    else:
        raise _bad(key, raw, f"expected {mapping}")
    _bounded(key, raw, pairs, form.partition("=")[0])
    return tuple(pairs)


def _bounded(key: str, raw: str, pairs, what: str) -> None:
    """At most PAIRS_MAX entries, none named twice."""
    if len(pairs) > PAIRS_MAX:
        raise _bad(key, raw, f"at most {PAIRS_MAX} entries")
    if len({n for n, _ in pairs}) != len(pairs):
        raise _bad(key, raw, f"{what} named twice")


# -- extra env and extended resources -----------------------------------------------------------
ENV_SETTINGS = ("platform.gpu_env",)  # (name, value) pairs, not labels
RESOURCE_SETTINGS = ("platform.gpu_extended_resources",)  # (resource, count) pairs
ANNOTATION_SETTINGS = ("platform.gpu_pod_annotations",)  # (label-key, any text) pairs
ANNOTATION_MAX = 16384  # characters of one annotation value (Kubernetes: 256 KiB in all)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")
_COUNT = re.compile(r"[1-9][0-9]{0,8}")
PAIRS_MAX = 64  # a bound on entries of one mapping setting
# What ckptflow itself sets on rank and fine-tune pods (templates.step_env, cloud_env, rank_env;
# tests/workflows/test_pod_parameters.py renders every one): an extra entry of the same name
# would win (Kubernetes keeps the last; a podSpecPatch merges by name) and silently break
# credentials, the rendezvous or the preemption save.
OWN_ENV = frozenset(
    {
        "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION",
        "GOOGLE_APPLICATION_CREDENTIALS", "AZURE_STORAGE_ACCOUNT_NAME",
        "AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_KEY", "MLFLOW_TRACKING_URI",
        "ARGO_WORKFLOW_NAME", "ARGO_WORKFLOW_UID", "ARGO_WORKFLOW_NAMESPACE", wiring.ARGO_UI,
        "PET_LOCAL_ADDR", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
        wiring.POD_NAME_VARIABLE, wiring.NODE_NAME_VARIABLE,
    }
)  # fmt: skip
# Set by their own settings (cpu, memory, gpu): a second entry would contradict them.
OWN_RESOURCES = ("cpu", "memory", "nvidia.com/gpu", "ephemeral-storage")


ENV_LIST = 'a JSON list of {"name": ..., "value": ...}'


def env_from_text(key: str, raw: str) -> tuple[tuple[str, str], ...]:
    """`{"NCCL_DEBUG": "INFO"}` (YAML/JSON), `NCCL_DEBUG=INFO,NCCL_IB_HCA=mlx5`, or a Pod spec's
    env list `[{"name": "NCCL_DEBUG", "value": "INFO"}]` (the per-run parameter's form) as
    (name, value) pairs; a name must be a C identifier (what a shell and torchrun can pass on)
    and none that ckptflow sets itself (OWN_ENV)."""
    listed = _structured(key, raw)
    if isinstance(listed, list):
        pairs = tuple(_env_entry(key, raw, entry) for entry in listed)
        _bounded(key, raw, pairs, "NAME")
        for pair in pairs:
            _check_pair(key, raw, pair)
        return pairs
    return _checked_pairs(
        key, raw, "NAME=VALUE", 'a mapping of variables, e.g. {"NCCL_DEBUG": "INFO"}'
    )


def _env_entry(key: str, raw: str, entry: Any) -> tuple[str, str]:
    """One entry of a Pod spec env list with a plain value, as (name, value)."""
    if (
        not isinstance(entry, dict)
        or set(entry) != {"name", "value"}
        or not all(isinstance(v, str) for v in entry.values())
    ):
        raise _bad(
            key,
            raw,
            f'expected a mapping of variables, e.g. {{"NCCL_DEBUG": "INFO"}}, or {ENV_LIST}',
        )
    return entry["name"], entry["value"]


def env_list(pairs: tuple[tuple[str, str], ...]) -> str:
    """(name, value) pairs as the JSON env list of a Pod spec (the per-run parameter's form)."""
    return json.dumps([{"name": n, "value": v} for n, v in pairs])


def annotations_from_text(key: str, raw: str) -> tuple[tuple[str, str], ...]:
    """`{"k8s.v1.cni.cncf.io/networks": "ib0"}` (YAML/JSON) or `key=value,...` as pairs."""
    return _checked_pairs(
        key, raw, "key=value", 'a mapping such as {"k8s.v1.cni.cncf.io/networks": "ib0"}'
    )


def resources_from_text(key: str, raw: str) -> tuple[tuple[str, str], ...]:
    """`rdma/ib=1` or `{"rdma/ib": 1}` as (extended resource, whole count) pairs."""
    return _checked_pairs(key, raw, "resource=count", 'a mapping such as {"rdma/ib": 1}')


def _checked_pairs(key: str, raw: str, form: str, example: str) -> tuple[tuple[str, str], ...]:
    """The pairs of a mapping setting's text, each checked by the setting's own rule."""
    pairs = _pairs_from_text(key, raw, form, example)
    for pair in pairs:
        _check_pair(key, raw, pair)
    return pairs


def _scalar(key: str, raw: str, v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float | str):
        return str(v)
    raise _bad(key, raw, f"{v!r} is not a string")


# -- tolerations -------------------------------------------------------------------------------
_TOLERATION_FIELDS = {
    "key": "key",
    "operator": "operator",
    "value": "value",
    "effect": "effect",
    "tolerationSeconds": "toleration_seconds",
    "toleration_seconds": "toleration_seconds",
}


def tolerations_from_text(key: str, raw: str, make) -> tuple:
    """`[{"key": "nvidia.com/gpu", "operator": "Exists"}]` (YAML/JSON, as in a Pod spec) or
    `key[=value]:Effect,...`, as `make(**fields)` each (config.Toleration), checked."""
    value = _structured(key, raw)
    if value is None:
        entries = [_short_toleration(key, raw, e.strip()) for e in raw.split(",") if e.strip()]
    elif isinstance(value, list | dict):
        entries = value if isinstance(value, list) else [value]
    else:
        raise _bad(key, raw, "expected a list of tolerations")
    return tuple(make(**_toleration_fields(key, raw, e)) for e in entries)


def _short_toleration(key: str, raw: str, entry: str) -> dict:
    kv, sep, effect = entry.rpartition(":")
    if not sep:
        kv, effect = entry, ""
    name, eq, val = kv.partition("=")
    if not name:
        raise _bad(key, raw, f"{entry!r} is not key[=value]:Effect")
    out = {"key": name, "operator": "Equal" if eq else "Exists", "effect": effect}
    return {**out, "value": val} if eq else out


def _toleration_fields(key: str, raw: str, entry: Any) -> dict:
    if not isinstance(entry, dict):
        raise _bad(key, raw, f"{entry!r} is not a toleration mapping (key, operator, ...)")
    unknown = sorted(set(entry) - set(_TOLERATION_FIELDS))
    if unknown:
        allowed = "key, operator, value, effect, tolerationSeconds"
        raise _bad(key, raw, f"unknown toleration field {unknown[0]!r}; use {allowed}")
    out = {_TOLERATION_FIELDS[k]: v for k, v in entry.items()}
    out.setdefault("operator", "Equal")
    for name in ("key", "operator", "value", "effect"):
        v = out.get(name)
        out[name] = "" if v is None else _scalar(key, raw, v)
    seconds = out.get("toleration_seconds")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int)):
        raise _bad(key, raw, f"tolerationSeconds {seconds!r} is not a whole number")
    return out


def _check_toleration(key: str, shown: str, t) -> None:
    if t.operator not in TOLERATION_OPERATORS:
        raise _bad(key, shown, f"operator {t.operator!r} {_one_of(TOLERATION_OPERATORS)}")
    if t.effect not in TOLERATION_EFFECTS:
        raise _bad(key, shown, f"effect {t.effect!r} {_one_of(TOLERATION_EFFECTS)}")
    if t.operator == "Exists" and t.value:
        raise _bad(key, shown, "operator Exists takes no value")
    if t.operator == "Equal" and not t.key:
        raise _bad(key, shown, "operator Equal needs a key")
    if t.key and not _label_key(t.key):
        raise _bad(key, shown, f"{t.key!r} is not a Kubernetes taint key")
    if t.toleration_seconds is not None and t.effect != "NoExecute":
        raise _bad(key, shown, "tolerationSeconds applies to effect NoExecute only")


# -- one value ---------------------------------------------------------------------------------
def check(key: str, value: Any, meta: dict, shown: str | None = None) -> None:
    """Raise ConfigError when `value` (already of the field's type) is not allowed for `key`.

    `meta` is the field's metadata (a contract step argument's `choices` and `at_least`);
    `shown` is the text the user wrote (default: the value)."""
    shown = _text(value) if shown is None else shown
    name = key.rsplit(".", 1)[-1]
    if key in ENUMS and value not in ENUMS[key]:
        raise _bad(key, shown, _one_of(ENUMS[key]))
    choices = tuple(meta.get("choices") or ())
    items = value if isinstance(value, tuple) else (value,)
    for item in items:
        if hasattr(item, "operator"):
            _check_toleration(key, shown, item)
            continue
        if isinstance(item, tuple):  # a label or env pair (also when set from Python)
            _check_pair(key, shown, item)
            continue
        if choices and item not in choices:
            raise _bad(key, shown, _one_of(choices))
        _check_number(key, name, item, meta, shown)
        _check_text(key, name, item, shown)


def _check_pair(key: str, shown: str, pair: tuple) -> None:
    name, val = pair
    if key in ENV_SETTINGS:
        if not _ENV_NAME.fullmatch(name):
            raise _bad(key, shown, f"{name!r} is not a variable name (letters, digits, '_')")
        if name in OWN_ENV:
            raise _bad(key, shown, f"{name!r} is set by ckptflow on these pods; leave it out")
    elif key in ANNOTATION_SETTINGS:
        if not _label_key(name):
            raise _bad(key, shown, f"{name!r} is not a Kubernetes annotation key")
        if len(val) > ANNOTATION_MAX:
            raise _bad(key, shown, f"{name!r}: a value of at most {ANNOTATION_MAX} characters")
    elif key in RESOURCE_SETTINGS:
        # Extended resources are domain-prefixed names with whole counts (request == limit).
        if name in OWN_RESOURCES or "/" not in name or not _label_key(name):
            why = "is not an extended resource such as rdma/ib (cpu, memory, GPUs: own settings)"
            raise _bad(key, shown, f"{name!r} {why}")
        if not _COUNT.fullmatch(val):
            raise _bad(key, shown, f"{val!r} is not a whole count of at least 1")
    elif not _label_key(name):
        raise _bad(key, shown, f"{name!r} is not a Kubernetes label key")
    elif val and not _LABEL_NAME.fullmatch(val):
        raise _bad(key, shown, f"{val!r} is not a Kubernetes label value")


PATCHES = ("platform.gpu_pod_spec_patch",)
# The podSpecPatch fields ckptflow sets on rank and fine-tune pods (templates.gpu_patch), with
# the setting that changes each. A user patch may not set them: the two are merged as YAML
# merge-key mappings, whose precedence parsers disagree on (PyYAML 6.0.4 lets the later one win
# for most keys), so no key is ever in both.
OWN_PATCH_FIELDS = {
    "containers": "extra env is gpu_env; resources are pretrain.rank_resources and finetune.resources",
    "terminationGracePeriodSeconds": "set pretrain.grace_s / finetune.grace_s",
    "hostNetwork": "set platform.gpu_host_network",
    "dnsPolicy": "set platform.gpu_host_network",
}
PATCH_MAX = 65536  # characters of a user podSpecPatch


def pod_spec_patch(key: str, text: str, shown: str | None = None) -> dict:
    """A user podSpecPatch: a YAML/JSON mapping of Pod spec fields (Argo merges it into the pod),
    at most PATCH_MAX characters; {} for ""."""
    shown = text if shown is None else shown
    if not text:
        return {}
    if len(text) > PATCH_MAX:
        raise _bad(key, shown[:80] + "...", f"at most {PATCH_MAX} characters")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem", None) or "malformed"
        raise _bad(key, shown, f"not valid YAML/JSON ({where})") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise _bad(key, shown, 'expected a mapping of Pod spec fields, e.g. {"priority": 10}')
    for field in OWN_PATCH_FIELDS:
        if field in value:
            raise _bad(key, shown, f"{field!r} is ckptflow's: {OWN_PATCH_FIELDS[field]}")
    return value


def _check_number(key: str, name: str, value: Any, meta: dict, shown: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise _bad(key, shown, "must be a finite number")
    low = meta.get("at_least")
    low = AT_LEAST.get(name, 0 if name.endswith("_s") else None) if low is None else low
    if name == "lrs" or name == "lr":
        if not 0 < value <= LR_CEILING:
            why = f"a learning rate must be above 0 and at most {LR_CEILING:g}, e.g. 1e-3"
            raise _bad(key, shown, why)
        return
    if name in PORTS and not 1 <= value <= 65535:
        raise _bad(key, shown, "a TCP port is 1 to 65535")
    if low is not None and value < low:
        raise _bad(key, shown, f"must be at least {low:g}")
    high = AT_MOST.get(name, NUMBER_CEILING)
    if value > high or value < -NUMBER_CEILING:
        raise _bad(key, shown, f"must be at most {_number(high)}" if value > high else "too small")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _check_text(key: str, name: str, value: Any, shown: str) -> None:
    if not isinstance(value, str):
        return
    if key in REQUIRED and not value.strip():
        raise _bad(key, shown, "must not be empty")
    if key in PATCHES and value:
        pod_spec_patch(key, value, shown)
    if key in URLS and value and not re.fullmatch(r"https?://\S+", value):  # "": no UI
        raise _bad(key, shown, "give a URL such as http://localhost:2746")
    if key == "platform.outputs_dir" and not value.startswith("/"):
        raise _bad(key, shown, "give an absolute path inside the container, e.g. /tmp/outputs")
    if key in OBJECT_NAMES and value and not _DNS_NAME.fullmatch(value):
        raise _bad(key, shown, "a Kubernetes name: lower-case letters, digits, '-' and '.'")
    if name in QUANTITIES:
        if value == "" and name == "shm_size":
            return
        if not quantity(value):
            raise _bad(key, shown, "not a Kubernetes quantity, e.g. 500m, 2, 1536Mi, 4Gi")
    elif key in ("name", "platform.namespace") and not _DNS_LABEL.fullmatch(value):
        raise _bad(key, shown, "use lower-case letters, digits and '-' (a DNS label)")
    elif name in TIMEOUTS and value and not _TIMEOUT.fullmatch(value):
        raise _bad(key, shown, "an Argo timeout: seconds or a Go duration such as 120h or 90m")
    elif name == "base_step" and not _BASE_STEP.fullmatch(value):
        raise _bad(key, shown, "use latest, a step number, or best:METRIC[:min|max]")
    elif key == "retention.timezone":
        _check_timezone(key, value, shown)
    elif key == "retention.policy":
        _check_policy(key, value, shown)
    elif key == "retention.schedules" and len(value.split()) not in (5, 6):
        raise _bad(key, shown, f"{value!r} is not a cron schedule such as '17 * * * *'")
    elif name == "metric" and not _METRIC.fullmatch(value):
        raise _bad(key, shown, "name an eval.json metric name, e.g. val_loss or exact_match")


def _check_timezone(key: str, value: str, shown: str) -> None:
    import zoneinfo

    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise _bad(key, shown, "not an IANA time zone, e.g. UTC or Europe/Berlin") from None


def _check_policy(key: str, value: str, shown: str) -> None:
    from ckptflow.core.gc import parse_policy
    from ckptflow.core.policy_syntax import PolicyError

    try:
        parse_policy(value)
    except PolicyError as exc:
        raise _bad(key, shown, str(exc)) from None

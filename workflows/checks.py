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

import math
import re
from typing import Any

from ckptflow.workflows.check_rules import (
    ANNOTATION_SETTINGS,
    ENV_SETTINGS,
    RESOURCE_SETTINGS,
    ConfigError,
    as_text,
    bad,
    check_pair,
    check_toleration,
    one_of,
)
from ckptflow.workflows.check_text import (
    ENV_LIST,
    OWN_PATCH_FIELDS,
    PATCHES,
    annotations_from_text,
    env_from_text,
    env_list,
    node_selector_from_text,
    pod_spec_patch,
    resources_from_text,
    tolerations_from_text,
)

__all__ = [
    "ANNOTATION_SETTINGS",
    "ENV_LIST",
    "ENV_SETTINGS",
    "OWN_PATCH_FIELDS",
    "RESOURCE_SETTINGS",
    "ConfigError",
    "annotations_from_text",
    "check",
    "env_from_text",
    "env_list",
    "node_selector_from_text",
    "pod_spec_patch",
    "quantity",
    "resources_from_text",
    "tolerations_from_text",
]


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
# An eval.json metric: MLflow logs it by name, and refuses one that could resolve to another
# as a path (mlflow/utils/validation.py path_not_unique: '..', '//', a leading '/').
_METRIC = re.compile(r"(?=.{1,250}$)[A-Za-z0-9_-]+(?:[./][A-Za-z0-9_-]+)*")
_BASE_STEP = re.compile(r"latest|[0-9]{1,18}|best:[A-Za-z0-9_./-]+(:(min|max))?")
# Template `timeout`s: "" (none), whole seconds, or a Go duration, which is what Argo parses
# (wfv1.ParseStringToDuration: strconv.Atoi, else time.ParseDuration; no days).
TIMEOUTS = ("timeout", "evaluator_timeout")
_TIMEOUT = re.compile(r"[0-9]{1,12}|(?:[0-9]{1,12}(?:\.[0-9]+)?(?:h|m|s|ms|us|ns))+")


def quantity(text: str) -> bool:
    """Whether `text` is a Kubernetes quantity ("500m", "2", "1.5Gi", "1e3")."""
    return bool(_QUANTITY.fullmatch(text))


# -- one value ---------------------------------------------------------------------------------
def check(key: str, value: Any, meta: dict, shown: str | None = None) -> None:
    """Raise ConfigError when `value` (already of the field's type) is not allowed for `key`.

    `meta` is the field's metadata (a contract step argument's `choices` and `at_least`);
    `shown` is the text the user wrote (default: the value)."""
    shown = as_text(value) if shown is None else shown
    name = key.rsplit(".", 1)[-1]
    if key in ENUMS and value not in ENUMS[key]:
        raise bad(key, shown, one_of(ENUMS[key]))
    choices = tuple(meta.get("choices") or ())
    items = value if isinstance(value, tuple) else (value,)
    for item in items:
        if hasattr(item, "operator"):
            check_toleration(key, shown, item)
            continue
        if isinstance(item, tuple):  # a label or env pair (also when set from Python)
            check_pair(key, shown, item)
            continue
        if choices and item not in choices:
            raise bad(key, shown, one_of(choices))
        _check_number(key, name, item, meta, shown)
        _check_text(key, name, item, shown)


def _check_number(key: str, name: str, value: Any, meta: dict, shown: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise bad(key, shown, "must be a finite number")
    low = meta.get("at_least")
    low = AT_LEAST.get(name, 0 if name.endswith("_s") else None) if low is None else low
    if name == "lrs" or name == "lr":
        if not 0 < value <= LR_CEILING:
            why = f"a learning rate must be above 0 and at most {LR_CEILING:g}, e.g. 1e-3"
            raise bad(key, shown, why)
        return
    if name in PORTS and not 1 <= value <= 65535:
        raise bad(key, shown, "a TCP port is 1 to 65535")
    if low is not None and value < low:
        raise bad(key, shown, f"must be at least {low:g}")
    high = AT_MOST.get(name, NUMBER_CEILING)
    if value > high or value < -NUMBER_CEILING:
        raise bad(key, shown, f"must be at most {_number(high)}" if value > high else "too small")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _check_text(key: str, name: str, value: Any, shown: str) -> None:
    if not isinstance(value, str):
        return
    if key in REQUIRED and not value.strip():
        raise bad(key, shown, "must not be empty")
    if key in PATCHES and value:
        pod_spec_patch(key, value, shown)
    if key in URLS and value and not re.fullmatch(r"https?://\S+", value):  # "": no UI
        raise bad(key, shown, "give a URL such as http://localhost:2746")
    if key == "platform.outputs_dir" and not value.startswith("/"):
        raise bad(key, shown, "give an absolute path inside the container, e.g. /tmp/outputs")
    if key in OBJECT_NAMES and value and not _DNS_NAME.fullmatch(value):
        raise bad(key, shown, "a Kubernetes name: lower-case letters, digits, '-' and '.'")
    if name in QUANTITIES:
        if value == "" and name == "shm_size":
            return
        if not quantity(value):
            raise bad(key, shown, "not a Kubernetes quantity, e.g. 500m, 2, 1536Mi, 4Gi")
    elif key in ("name", "platform.namespace") and not _DNS_LABEL.fullmatch(value):
        raise bad(key, shown, "use lower-case letters, digits and '-' (a DNS label)")
    elif name in TIMEOUTS and value and not _TIMEOUT.fullmatch(value):
        raise bad(key, shown, "an Argo timeout: seconds or a Go duration such as 120h or 90m")
    elif name == "base_step" and not _BASE_STEP.fullmatch(value):
        raise bad(key, shown, "use latest, a step number, or best:METRIC[:min|max]")
    elif key == "retention.timezone":
        _check_timezone(key, value, shown)
    elif key == "retention.policy":
        _check_policy(key, value, shown)
    elif key == "retention.schedules" and len(value.split()) not in (5, 6):
        raise bad(key, shown, f"{value!r} is not a cron schedule such as '17 * * * *'")
    elif name == "metric" and not _METRIC.fullmatch(value):
        raise bad(key, shown, "name an eval.json metric name, e.g. val_loss or exact_match")


def _check_timezone(key: str, value: str, shown: str) -> None:
    import zoneinfo

    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise bad(key, shown, "not an IANA time zone, e.g. UTC or Europe/Berlin") from None


def _check_policy(key: str, value: str, shown: str) -> None:
    from ckptflow.core.gc import parse_policy
    from ckptflow.core.policy_syntax import PolicyError

    try:
        parse_policy(value)
    except PolicyError as exc:
        raise bad(key, shown, str(exc)) from None

"""The rules of one entry of a structured `--set` setting (checks.py): a label or annotation
key, a variable name, an extended resource, a toleration; and `ConfigError`, the one-line
mistake every check raises (`--set KEY=VALUE: why`).

Sources: Kubernetes label keys and values (apimachinery validation IsQualifiedName,
IsValidLabelValue), taints and tolerations (core/v1 types.go Toleration), extended resources
(a domain-prefixed name with a whole count).
"""

from __future__ import annotations

import re
from typing import Any

from ckptflow import env as wiring

__all__ = ["ConfigError", "as_text", "bad", "check_pair", "check_toleration", "label_key", "one_of"]


class ConfigError(ValueError):
    """A user-supplied setting is unknown or malformed; the message names the fix."""


_LABEL_NAME = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)")
_LABEL_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
TOLERATION_OPERATORS = ("Equal", "Exists")
TOLERATION_EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
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
        wiring.POD_NAME_VARIABLE, *wiring.NODE_NAME_VARIABLES,
    }
)  # fmt: skip
# Set by their own settings (cpu, memory, gpu): a second entry would contradict them.
OWN_RESOURCES = ("cpu", "memory", "nvidia.com/gpu", "ephemeral-storage")


def bad(key: str, value: Any, why: str) -> ConfigError:
    shown = value if isinstance(value, str) else as_text(value)
    return ConfigError(f"--set {key}={shown}: {why}")


def as_text(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def one_of(allowed: tuple) -> str:
    return "not one of " + ", ".join(repr(a) if a == "" else str(a) for a in allowed)


def label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    return bool(_LABEL_NAME.fullmatch(name)) and (
        not prefix or bool(_LABEL_PREFIX.fullmatch(prefix))
    )


def check_toleration(key: str, shown: str, t) -> None:
    if t.operator not in TOLERATION_OPERATORS:
        raise bad(key, shown, f"operator {t.operator!r} {one_of(TOLERATION_OPERATORS)}")
    if t.effect not in TOLERATION_EFFECTS:
        raise bad(key, shown, f"effect {t.effect!r} {one_of(TOLERATION_EFFECTS)}")
    if t.operator == "Exists" and t.value:
        raise bad(key, shown, "operator Exists takes no value")
    if t.operator == "Equal" and not t.key:
        raise bad(key, shown, "operator Equal needs a key")
    if t.key and not label_key(t.key):
        raise bad(key, shown, f"{t.key!r} is not a Kubernetes taint key")
    if t.toleration_seconds is not None and t.effect != "NoExecute":
        raise bad(key, shown, "tolerationSeconds applies to effect NoExecute only")


def check_pair(key: str, shown: str, pair: tuple) -> None:
    name, val = pair
    if key in ENV_SETTINGS:
        if not _ENV_NAME.fullmatch(name):
            raise bad(key, shown, f"{name!r} is not a variable name (letters, digits, '_')")
        if name in OWN_ENV:
            raise bad(key, shown, f"{name!r} is set by ckptflow on these pods; leave it out")
    elif key in ANNOTATION_SETTINGS:
        if not label_key(name):
            raise bad(key, shown, f"{name!r} is not a Kubernetes annotation key")
        if len(val) > ANNOTATION_MAX:
            raise bad(key, shown, f"{name!r}: a value of at most {ANNOTATION_MAX} characters")
    elif key in RESOURCE_SETTINGS:
        # Extended resources are domain-prefixed names with whole counts (request == limit).
        if name in OWN_RESOURCES or "/" not in name or not label_key(name):
            why = "is not an extended resource such as rdma/ib (cpu, memory, GPUs: own settings)"
            raise bad(key, shown, f"{name!r} {why}")
        if not _COUNT.fullmatch(val):
            raise bad(key, shown, f"{val!r} is not a whole count of at least 1")
    elif not label_key(name):
        raise bad(key, shown, f"{name!r} is not a Kubernetes label key")
    elif val and not _LABEL_NAME.fullmatch(val):
        raise bad(key, shown, f"{val!r} is not a Kubernetes label value")

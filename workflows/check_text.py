"""Structured `--set` settings read from their text (checks.py): node selectors, extra env,
pod annotations, extended resources, tolerations and a podSpecPatch, as YAML/JSON (the form of
a Pod spec) or the short forms `a=b,c=d` and `key[=value]:Effect,...`; each entry checked by
check_rules.py, and every mapping bounded (PAIRS_MAX entries, PATCH_MAX characters).
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from ckptflow.workflows.check_rules import (
    PAIRS_MAX,
    ConfigError,
    bad,
    check_pair,
)

__all__ = [
    "annotations_from_text",
    "env_from_text",
    "env_list",
    "node_selector_from_text",
    "pod_spec_patch",
    "resources_from_text",
    "tolerations_from_text",
]

ENV_LIST = 'a JSON list of {"name": ..., "value": ...}'


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
        check_pair(key, raw, pair)
    return pairs


def _pairs_from_text(key: str, raw: str, form: str, mapping: str) -> tuple[tuple[str, str], ...]:
    """A YAML/JSON mapping, or `a=b,c=d`, as (name, value) pairs (not yet checked)."""
    value = _structured(key, raw)
    if value is None:
        pairs = []
        for entry in (p.strip() for p in raw.split(",") if p.strip()):
            name, sep, val = entry.partition("=")
            if not sep:
                raise bad(key, raw, f"{entry!r} is not {form}; or give a mapping")
            pairs.append((name.strip(), val.strip()))
    elif isinstance(value, dict):
        pairs = [(str(k), "" if v is None else _scalar(key, raw, v)) for k, v in value.items()]
    else:
        raise bad(key, raw, f"expected {mapping}")
    _bounded(key, raw, pairs, form.partition("=")[0])
    return tuple(pairs)


def _bounded(key: str, raw: str, pairs, what: str) -> None:
    """At most PAIRS_MAX entries, none named twice."""
    if len(pairs) > PAIRS_MAX:
        raise bad(key, raw, f"at most {PAIRS_MAX} entries")
    if len({n for n, _ in pairs}) != len(pairs):
        raise bad(key, raw, f"{what} named twice")


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
            check_pair(key, raw, pair)
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
        raise bad(
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
        check_pair(key, raw, pair)
    return pairs


def _scalar(key: str, raw: str, v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float | str):
        return str(v)
    raise bad(key, raw, f"{v!r} is not a string")


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
        raise bad(key, raw, "expected a list of tolerations")
    return tuple(make(**_toleration_fields(key, raw, e)) for e in entries)


def _short_toleration(key: str, raw: str, entry: str) -> dict:
    kv, sep, effect = entry.rpartition(":")
    if not sep:
        kv, effect = entry, ""
    name, eq, val = kv.partition("=")
    if not name:
        raise bad(key, raw, f"{entry!r} is not key[=value]:Effect")
    out = {"key": name, "operator": "Equal" if eq else "Exists", "effect": effect}
    return {**out, "value": val} if eq else out


def _toleration_fields(key: str, raw: str, entry: Any) -> dict:
    if not isinstance(entry, dict):
        raise bad(key, raw, f"{entry!r} is not a toleration mapping (key, operator, ...)")
    unknown = sorted(set(entry) - set(_TOLERATION_FIELDS))
    if unknown:
        allowed = "key, operator, value, effect, tolerationSeconds"
        raise bad(key, raw, f"unknown toleration field {unknown[0]!r}; use {allowed}")
    out = {_TOLERATION_FIELDS[k]: v for k, v in entry.items()}
    out.setdefault("operator", "Equal")
    for name in ("key", "operator", "value", "effect"):
        v = out.get(name)
        out[name] = "" if v is None else _scalar(key, raw, v)
    seconds = out.get("toleration_seconds")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int)):
        raise bad(key, raw, f"tolerationSeconds {seconds!r} is not a whole number")
    return out


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
        raise bad(key, shown[:80] + "...", f"at most {PATCH_MAX} characters")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem", None) or "malformed"
        raise bad(key, shown, f"not valid YAML/JSON ({where})") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise bad(key, shown, 'expected a mapping of Pod spec fields, e.g. {"priority": 10}')
    for field in OWN_PATCH_FIELDS:
        if field in value:
            raise bad(key, shown, f"{field!r} is ckptflow's: {OWN_PATCH_FIELDS[field]}")
    return value

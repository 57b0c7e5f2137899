"""The per-run knobs of a workflow as Argo workflow parameters (`spec.arguments.parameters`).

What a person changes from one run to the next (steps, checkpoint interval and policy, ranks,
learning rates, variants, model, task, selection metric) is a workflow parameter with a
description and, where it has one, an enum, so `argo submit -p ranks=4`, the Argo UI's
resubmit form, `ckptflow submit ... -p` and `ckptflow run ... -p` change it without
re-rendering. Its default is the configuration's value (`--set pretrain.ranks=4` renders 4).
The templates read each one as `{{workflow.parameters.NAME}}`; the ranks fan out with
`withSequence` and the fine-tune variants with `withParam` over the `variants` JSON list.

`check_values` checks `-p` values by the same rules as `--set` (ckptflow.workflows.checks).
"""

from __future__ import annotations

import difflib
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ckptflow.workflows import checks
from ckptflow.workflows.checks import LR_CEILING
from ckptflow.workflows.config import (
    ConfigError,
    FinetuneConfig,
    PipelineConfig,
    apply_overrides,
    settings,
    shown_value,
    value_at,
)
from hera.workflows import Parameter

__all__ = [
    "FINETUNE",
    "PIPELINE",
    "POD",
    "PRETRAIN",
    "Knob",
    "arguments",
    "check_values",
    "ref",
    "variant_items",
]


@dataclass(frozen=True)
class Knob:
    """One workflow parameter: its name, the `--set` key giving its default, what it means."""

    name: str  # the Argo parameter name
    key: str  # the setting whose value is its default ("" for those computed, e.g. variants)
    description: str  # one line, shown by the Argo UI's submit form


_PRETRAIN = (
    Knob("model", "pretrain.model", "named model size"),
    Knob("pretrain_task", "pretrain.task", "corpus task the base model is pretrained on"),
    Knob("ranks", "pretrain.ranks", "pretraining rank pods (torchrun nodes)"),
    Knob("pretrain_steps", "pretrain.max_steps", "pretraining optimizer steps in total"),
    Knob("pretrain_lr", "pretrain.lr", "pretraining peak learning rate"),
    Knob("ckpt_every", "pretrain.ckpt_every", "pretraining: save a checkpoint every K steps"),
    Knob("full_every", "pretrain.full_every", "every F-th save is full, the others are deltas"),
    Knob(
        "pretrain_timeout", "pretrain.timeout", "timeout of each rank pod, e.g. 120h (empty: none)"
    ),
    Knob(
        "evaluator_timeout",
        "pretrain.evaluator_timeout",
        "timeout of each evaluator beside training, e.g. 120h (empty: none)",
    ),
)
_FINETUNE = (
    Knob("finetune_task", "finetune.task", "task the variants are fine-tuned and ranked on"),
    Knob("finetune_steps", "finetune.max_steps", "fine-tuning optimizer steps per variant"),
    Knob("finetune_ckpt_every", "finetune.ckpt_every", "fine-tuning: save every K steps"),
    Knob("base_step", "finetune.base_step", "base checkpoint: latest | best:METRIC | a step"),
    Knob("finetune_timeout", "finetune.timeout", "timeout of each variant pod (empty: none)"),
    Knob(
        "variants",
        "",
        'fine-tune grid, a JSON list of {"lr": "1e-3", "freeze": "1"} (lr: peak learning rate, '
        "freeze: leading blocks kept frozen)",
    ),
    Knob("metric", "finetune.metric", "eval.json metric that selects the champion"),
    Knob("mode", "finetune.mode", "whether a lower (min) or higher (max) metric is better"),
)
# Pod settings that vary per run (issue 33 point 4): on the rank and fine-tune (GPU) pods,
# read in their podSpecPatch (templates.gpu_patch), and every pod's PriorityClass. Each is
# in the form Argo puts in the pod: an env list and a patch are JSON, inline in the patch.
POD = (
    Knob(
        "gpu_env",
        "platform.gpu_env",
        'extra env of rank and fine-tune pods, a JSON list of {"name": ..., "value": ...}, '
        "e.g. NCCL_DEBUG",
    ),
    Knob(
        "gpu_pod_spec_patch",
        "platform.gpu_pod_spec_patch",
        "podSpecPatch of rank and fine-tune pods, a JSON object beside ckptflow's own fields "
        "(containers, terminationGracePeriodSeconds, hostNetwork, dnsPolicy: not these)",
    ),
    Knob(
        "priority_class",
        "platform.priority_class_name",
        "PriorityClass of every pod (empty: default)",
    ),
)
PRETRAIN = _PRETRAIN + POD
FINETUNE = _FINETUNE + POD
PIPELINE = _PRETRAIN + _FINETUNE + POD
BASE_ROOT = "base_root"  # the fine-tune workflow's base (no default: given at submission)


def ref(name: str) -> str:
    """The Argo expression of workflow parameter `name`."""
    return "{{workflow.parameters." + name + "}}"


def variant_name(lr: str, freeze: str) -> str:
    """A variant's name (its folder) from its grid values, as Argo writes them."""
    return f"lr{lr}-freeze{freeze}"


def variants(c: FinetuneConfig) -> list[dict[str, str]]:
    """The grid: name, lr, freeze (strings, as Argo passes them)."""
    grid = [
        {"name": variant_name(f"{lr:g}", str(k)), "lr": f"{lr:g}", "freeze": str(k)}
        for lr, k in itertools.product(c.lrs, c.freeze_blocks)
    ]
    if not grid:
        raise ConfigError("finetune.lrs and finetune.freeze_blocks must each name a value")
    names = [v["name"] for v in grid]
    if len(set(names)) != len(names):
        raise ConfigError(f"finetune grid has duplicate variants {names}; remove repeats")
    return grid


def variant_items(cfg: PipelineConfig) -> list[dict[str, str]]:
    """The default `variants`: the grid finetune.lrs x finetune.freeze_blocks (as strings)."""
    return [{"lr": v["lr"], "freeze": v["freeze"]} for v in variants(cfg.finetune)]


def default_values(cfg: PipelineConfig, knobs: Sequence[Knob]) -> dict[str, str]:
    """Each knob's value from the configuration."""
    keys = settings(type(cfg))
    out = {}
    for k in knobs:
        if k.name == "variants":
            out[k.name] = json.dumps(variant_items(cfg), separators=(",", ":"))
        elif k.name == "gpu_env":
            out[k.name] = checks.env_list(cfg.platform.gpu_env)
        elif k.name == "gpu_pod_spec_patch":
            text = cfg.platform.gpu_pod_spec_patch
            out[k.name] = json.dumps(checks.pod_spec_patch(k.key, text))
        else:
            out[k.name] = shown_value(value_at(cfg, keys[k.key].path))
    return out


def _enum(cfg: PipelineConfig, knob: Knob) -> list[str] | None:
    if not knob.key:
        return None
    choices = settings(type(cfg))[knob.key].meta.get("choices") or ()
    return list(choices) or None


def arguments(cfg: PipelineConfig, knobs: Sequence[Knob]) -> list[Parameter]:
    """`spec.arguments.parameters` of a workflow reading `knobs`, defaults from `cfg`."""
    values = default_values(cfg, knobs)
    return [
        Parameter(name=k.name, value=values[k.name], description=k.description, enum=_enum(cfg, k))
        for k in knobs
    ]


def parse_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """`-p NAME=VALUE` texts as a mapping (a later one wins)."""
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"-p {pair!r}: expected NAME=VALUE, e.g. -p ranks=4")
        out[name.strip()] = value
    return out


# A bound on one `-p` value (a JSON grid or a pod patch is the longest a knob takes), and on the
# variants of one run: each is a pod and an Argo node, and Argo keeps the whole workflow status
# in one object.
MAX_VALUE = 65536
MAX_VARIANTS = 256
_LR = re.compile(r"(?:[0-9]{1,12}(?:\.[0-9]{0,12})?|\.[0-9]{1,12})(?:[eE][-+]?[0-9]{1,3})?")
_FREEZE = re.compile(r"[0-9]{1,3}")


def check_values(
    cfg: PipelineConfig, knobs: Sequence[Knob], values: Mapping[str, str], extra=()
) -> None:
    """Raise ConfigError (one line) for an unknown parameter or a value `--set` would refuse."""
    known = {k.name: k for k in knobs}
    for name, value in values.items():
        if len(value) > MAX_VALUE:
            raise ConfigError(f"-p {name}={shown(value)}: at most {MAX_VALUE} characters")
        if name in extra:
            continue
        knob = known.get(name)
        if knob is None:
            names = [*known, *extra]
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigError(
                f"-p {name}={shown(value)}: no such workflow parameter; {hint}"
                f"known: {', '.join(names)}"
            )
        try:
            if knob.name == "variants":
                _check_variants(value)
            else:
                _check_form(knob.name, value)
                apply_overrides(cfg, [f"{knob.key}={value}"])
        except ConfigError as exc:
            msg, prefix = str(exc), f"--set {knob.key}={value}: "
            why = msg[len(prefix) :] if msg.startswith(prefix) else msg.split(": ", 1)[-1]
            raise ConfigError(f"-p {name}={shown(value)}: {shown(why, 300)}") from None
    if "ranks" in values and "ranks" in known:
        _check_replicas(cfg, int(values["ranks"]))


def _check_replicas(cfg: PipelineConfig, ranks: int) -> None:
    """Each local-tier replica lives on another rank pod's node (workflows/local_tier.py): a
    run's `-p ranks` must leave room for `pretrain.replicas` of them."""
    replicas = cfg.pretrain.train.replicas
    if replicas and replicas >= ranks:
        raise ConfigError(
            f"-p ranks={ranks}: pretrain.replicas={replicas} puts each replica on another rank "
            f"pod's node; use ranks of at least {replicas + 1} (or fewer replicas)"
        )


def shown(text: str, limit: int = 80) -> str:
    """`text` as one short line of an error message: as it is when it is, else its repr cut."""
    if len(text) <= limit and text.isprintable():
        return text
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def _check_form(name: str, text: str) -> None:
    """The pod knobs are substituted into a podSpecPatch as they are: JSON of the kind there."""
    kinds = {"gpu_env": (list, checks.ENV_LIST), "gpu_pod_spec_patch": (dict, "a JSON object")}
    if name not in kinds:
        return
    kind, what = kinds[name]
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, kind):
        raise ConfigError(f"x: expected {what}")


def _check_variants(text: str) -> None:
    example = '[{"lr": "1e-3", "freeze": "1"}]'
    try:
        items = json.loads(text)
    except ValueError:
        items = None
    if not isinstance(items, list) or not items:
        raise ConfigError(f"x: expected a non-empty JSON list such as {example}")
    if len(items) > MAX_VARIANTS:
        raise ConfigError(f"x: {len(items)} variants; at most {MAX_VARIANTS} variants per run")
    seen = set()
    for item in items:
        if not isinstance(item, dict) or set(item) != {"lr", "freeze"}:
            raise ConfigError(f"x: each variant is an object with lr and freeze, e.g. {example}")
        # Both name the variant's folder and Argo node (lr{lr}-freeze{freeze}): plain ASCII
        # digits only, not what float() and int() also read ('inf', '1_0', ' 1', '+1', '١').
        lr, freeze = _text(item["lr"]), _text(item["freeze"])
        if not _LR.fullmatch(lr) or not _FREEZE.fullmatch(freeze):
            raise ConfigError(
                f"x: lr is a number (e.g. 1e-3) and freeze a whole number of at most 3 "
                f"digits, e.g. {example}"
            )
        if not 0 < float(lr) <= LR_CEILING:
            raise ConfigError(f"x: lr must be above 0 and at most {LR_CEILING:g}")
        if (str(item["lr"]), str(item["freeze"])) in seen:
            raise ConfigError(f"x: variant {item} is listed twice")
        seen.add((str(item["lr"]), str(item["freeze"])))


def _text(value: object) -> str:
    """A grid value as Argo passes it ({{item.lr}}): a JSON string as is, a number as text."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return repr(value)  # refused by the patterns
    return value if isinstance(value, str) else json.dumps(value)

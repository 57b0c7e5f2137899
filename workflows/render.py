"""`ckptflow render NAME [-o FILE] [--set key=value ...]`: the manifests a builder makes.

NAME is one of BUILDERS. The output is YAML (several documents for `evaluate`: the
WorkflowTemplate, then the Argo Events EventSource and Sensor), ready for `kubectl apply`,
`argo submit` or `ckptflow run FILE` (the local runner).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import yaml
from ckptflow.workflows.config import (
    ConfigError,
    PipelineConfig,
    apply_overrides,
    describe,
    validate,
)


@dataclass(frozen=True)
class Builder:
    """One renderable workflow: how to build its hera object and its extra manifests."""

    build: Callable[[PipelineConfig], object]  # cfg -> hera Workflow/CronWorkflow/template
    extras: Callable[[PipelineConfig], list[dict]] | None  # further (non-Argo-Workflows) docs
    help: str  # one line for --help


def _builders() -> dict[str, Builder]:
    from ckptflow.workflows.evaluate_template import build_evaluate, event_source, sensor
    from ckptflow.workflows.finetune_dag import build_finetune
    from ckptflow.workflows.pipeline import build_pipeline
    from ckptflow.workflows.pretrain_dag import build_pretrain
    from ckptflow.workflows.retention_cron import build_retention

    return {
        "pipeline": Builder(build_pipeline, None, "pretrain -> fine-tune fan-out -> select"),
        "pretrain": Builder(build_pretrain, None, "N-rank pretraining + background evaluator"),
        "finetune": Builder(build_finetune, None, "fine-tune variants + select (fan-in)"),
        "retention": Builder(build_retention, None, "CronWorkflow running ckptflow ckpt gc"),
        "evaluate": Builder(
            build_evaluate,
            lambda cfg: [event_source(cfg), sensor(cfg)],
            "WorkflowTemplate + MinIO EventSource + Sensor",
        ),
    }


BUILDER_NAMES = ("pipeline", "pretrain", "finetune", "retention", "evaluate")


def builder(name: str) -> Builder:
    """The builder called `name`, or a ConfigError listing the names."""
    builders = _builders()
    if name not in builders:
        raise ConfigError(f"unknown workflow {name!r}; choose one of {', '.join(BUILDER_NAMES)}")
    return builders[name]


def config(overrides: Iterable[str] = (), base: PipelineConfig | None = None) -> PipelineConfig:
    """The default config (or `base`) with `--set` overrides applied, every setting checked."""
    cfg = apply_overrides(base or PipelineConfig(), overrides)
    validate(cfg)
    return cfg


def manifests(name: str, cfg: PipelineConfig) -> list[dict]:
    """Every manifest of workflow `name` as plain dicts, the Argo Workflows one first."""
    b = builder(name)
    docs = [b.build(cfg).to_dict()]
    if b.extras:
        docs += b.extras(cfg)
    return docs


def to_yaml(docs: list[dict]) -> str:
    """Documents as one YAML stream (key order kept as built)."""
    return yaml.safe_dump_all(docs, sort_keys=False, width=100)


def add_common_args(ap: argparse.ArgumentParser) -> None:
    """NAME and --set, shared by render and submit."""
    ap.add_argument("name", metavar="NAME", choices=BUILDER_NAMES, help=", ".join(BUILDER_NAMES))
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a setting, e.g. --set pretrain.ranks=4 (see --keys)",
    )


def main(argv: list[str] | None = None) -> int:
    """Render NAME's manifests to stdout or -o FILE."""
    if "--keys" in (sys.argv[1:] if argv is None else argv):
        print("\n".join(describe()))
        return 0
    ap = argparse.ArgumentParser(prog="ckptflow render", description=__doc__.split("\n")[0])
    add_common_args(ap)
    ap.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    ap.add_argument("--keys", action="store_true", help="list every setting and its default")
    args = ap.parse_args(argv)
    try:
        text = to_yaml(manifests(args.name, config(args.overrides)))
    except ConfigError as exc:
        print(f"ckptflow render: {exc}", file=sys.stderr)
        return 2
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0

"""`ckptflow render NAME [-o FILE] [--set key=value ...] [--template | --from-template] [-p NAME=VALUE ...]`:
the manifests a builder makes.

NAME is one of BUILDERS. The output is YAML (several documents for `evaluate`: the
WorkflowTemplate, then the Argo Events EventSource and Sensor), ready for `kubectl apply`,
`argo submit` or `ckptflow run FILE` (the local runner). For pipeline, pretrain and finetune,
`--template` renders the WorkflowTemplate to install once, `--from-template` the Workflow that
runs it, and `-p` sets workflow parameters (`--set` settings are rendered in; parameters stay
changeable at submission).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import yaml
from ckptflow.workflows.config import (
    ConfigError,
    PipelineConfig,
    apply_overrides,
    describe,
    validate,
)
from ckptflow.workflows.parameters import parse_pairs
from ckptflow.workflows.pod_checks import notices as pod_notices

from ckptflow.contract import cli_args


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
EXAMPLES = """examples:
  ckptflow render pipeline -o pipeline.yaml --set pretrain.ranks=4
  ckptflow render pipeline --template | kubectl apply -f -
  ckptflow render pipeline --from-template -p ranks=4 | argo submit -
  ckptflow render --keys                    every setting and its default"""


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


def manifests(
    name: str, cfg: PipelineConfig, form: str = "workflow", values: Mapping[str, str] = {}
) -> list[dict]:
    """Every manifest of workflow `name` as plain dicts, the Argo Workflows one first.

    `form` is one of `forms.FORMS`; `values` are workflow parameters (`-p`), checked."""
    from ckptflow.workflows import forms

    b = builder(name)
    forms.check_values(name, cfg, values)
    if form == "from-template":
        return [forms.from_template(name, cfg, values)]
    doc = forms.with_values(b.build(cfg).to_dict(), values) if values else b.build(cfg).to_dict()
    docs = [forms.template(name, doc, cfg) if form == "template" else doc]
    if b.extras:
        docs += b.extras(cfg)
    return docs


def to_yaml(docs: list[dict]) -> str:
    """Documents as one YAML stream (key order kept as built)."""
    return yaml.safe_dump_all(docs, sort_keys=False, width=100)


def add_common_args(ap: argparse.ArgumentParser) -> None:
    """NAME, --set, -p, --template and --from-template, shared by render and submit."""
    ap.add_argument("name", metavar="NAME", choices=BUILDER_NAMES, help=", ".join(BUILDER_NAMES))
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a setting, e.g. --set pretrain.ranks=4 (see --keys)",
    )
    ap.add_argument(
        "-p", "--parameter", dest="parameters", action="append", default=[],
        metavar="NAME=VALUE", help="a workflow parameter, e.g. -p ranks=4 (like argo submit -p)",
    )  # fmt: skip
    form = ap.add_mutually_exclusive_group()
    form.add_argument(
        "--template", dest="form", action="store_const", const="template", default="workflow",
        help="the WorkflowTemplate (installed once) instead of a Workflow",
    )  # fmt: skip
    form.add_argument(
        "--from-template", dest="form", action="store_const", const="from-template",
        help="a Workflow running the installed WorkflowTemplate (workflowTemplateRef)",
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Render NAME's manifests to stdout or -o FILE."""
    if "--keys" in (sys.argv[1:] if argv is None else argv):
        print("\n".join(describe()))
        return 0
    ap = cli_args.Parser(
        prog="ckptflow render", description=__doc__.split("\n")[0], epilog=EXAMPLES
    )
    add_common_args(ap)
    ap.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    ap.add_argument("--keys", action="store_true", help="list every setting and its default")
    args = cli_args.parse(ap, argv, {"--set", "-p", "--parameter"})
    if isinstance(args, int):
        return args
    try:
        values = parse_pairs(args.parameters)
        cfg = config(args.overrides)
        text = to_yaml(manifests(args.name, cfg, args.form, values))
    except ConfigError as exc:
        print(f"ckptflow render: {exc}", file=sys.stderr)
        return 2
    for line in pod_notices(cfg):
        print(f"ckptflow render: note: {line}", file=sys.stderr)
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0

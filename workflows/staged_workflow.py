"""One MLflow parent run per workflow: `start_run` first, `finish_run` as the exit handler.

Naming scheme (what the Argo UI's `links` entry relies on): the parent run's *name* is the
workflow's name. The run id is only known once `start_run` has run, so it cannot be a label
set at submission; instead

- the label `ckptflow.io/mlflow-experiment` (static) names the experiment, and
- `spec.workflowMetadata.labelsFrom` sets `ckptflow.io/mlflow-run-name` to the workflow
  name when the controller admits the workflow,

so a controller `links` entry (scope `workflow`) opens the run by name, e.g.

    - name: MLflow run
      scope: workflow
      url: http://MLFLOW/#/experiments/EXPERIMENT_ID?workflowType=machine_learning&searchFilter=attributes.run_name%3D%22${metadata.name}%22

where EXPERIMENT_ID is the id of the experiment named by the label (the deployment creates
it, so it knows the id). `${metadata.name}` and the run-name label are equal.
The run id itself is a workflow output (`mlflow_run_id`, visible in the UI's outputs) via
`globalName`, which is also how the exit handler reaches it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from ckptflow.workflows import templates
from ckptflow.workflows.config import PipelineConfig
from ckptflow.workflows.templates import step
from hera.workflows import DAG, Container, Parameter, Workflow
from hera.workflows.models import LabelValueFrom, ValueFrom, WorkflowMetadata

from ckptflow.contract import FinishRunArgs, StartRunArgs, to_argv

RUN_NAME_LABEL = "ckptflow.io/mlflow-run-name"
EXPERIMENT_LABEL = "ckptflow.io/mlflow-experiment"
GLOBAL_RUN_ID = "mlflow_run_id"
START_TASK = "start-run"
# What every step after start_run passes as --mlflow-parent-run-id.
PARENT_RUN_ID = "{{tasks." + START_TASK + ".outputs.parameters.run_id}}"


def labels(cfg: PipelineConfig) -> dict[str, str]:
    """Static labels of a lineage-tracked workflow."""
    return {EXPERIMENT_LABEL: cfg.platform.experiment, "app.kubernetes.io/part-of": "ckptflow"}


def workflow_metadata() -> WorkflowMetadata:
    """Runtime labels: the MLflow run name (= workflow name) for the UI link."""
    return WorkflowMetadata(
        labels_from={RUN_NAME_LABEL: LabelValueFrom(expression="workflow.name")}
    )


def start_run_template(cfg: PipelineConfig) -> Container:
    """`ckptflow.steps.start_run`: creates the parent run (named after the workflow), outputs its id.

    Its MLflow params are the workflow parameters (`{{workflow.parameters.json}}`).
    """
    p = cfg.platform
    args = StartRunArgs(
        experiment=p.experiment,
        output_dir=p.outputs_dir,  # its own outputs below, not step()'s
    )
    names = {
        # The run's params: the workflow parameters as this run got them (`-p` included),
        # not a rendered copy of the whole configuration.
        "config_json": "{{workflow.parameters.json}}",
        "run_name": "{{workflow.name}}",
        "workflow_name": "{{workflow.name}}",
        "workflow_uid": "{{workflow.uid}}",
        "namespace": "{{workflow.namespace}}",
    }
    tpl = step(
        "start-run", "start_run", to_argv(args, **names), platform=p, retries=2, backoff_s=5,
        transient_only=True,  # a failed start (MLflow refused) fails again
    )  # fmt: skip
    # run_id doubles as a workflow output, which is how the exit handler reaches it.
    (run_id,) = StartRunArgs.OUTPUTS
    tpl.outputs = [
        Parameter(
            name=run_id,
            value_from=ValueFrom(path=f"{p.outputs_dir}/{run_id}"),
            global_name=GLOBAL_RUN_ID,
        )
    ]
    return tpl


def finish_run_template(cfg: PipelineConfig) -> Container:
    """`ckptflow.steps.finish_run`: the exit handler closing the parent run with the workflow status."""
    args = to_argv(
        FinishRunArgs(),
        run_id="{{workflow.outputs.parameters." + GLOBAL_RUN_ID + "}}",
        status="{{workflow.status}}",
    )
    return step(
        "finish-run", "finish_run", args, platform=cfg.platform, retries=2, backoff_s=5,
        transient_only=True,
    )  # fmt: skip


def lineage_workflow(cfg: PipelineConfig, *, prefix: str, title: str, description: str) -> Workflow:
    """An empty Workflow with the shared settings, labels and the finish_run exit handler."""
    return Workflow(
        generate_name=f"{prefix}-",
        entrypoint="main",
        on_exit="finish-run",
        labels=labels(cfg),
        workflow_metadata=workflow_metadata(),
        **templates.workflow_kwargs(
            cfg.platform, title=title, description=description, per_run=True
        ),
    )


class Stage(NamedTuple):
    """One DAG of a lineage-tracked workflow: its task name, the function adding its templates
    (inside the Workflow context; returns the DAG), and the task's arguments."""

    name: str
    add: Callable[[PipelineConfig], DAG]
    arguments: dict[str, str]


def staged_workflow(
    cfg: PipelineConfig,
    stages: Sequence[Stage],
    *,
    prefix: str,
    title: str,
    description: str,
    arguments: list[Parameter] | None = None,
) -> Workflow:
    """start_run -> each stage in order, all nested under one parent run; finish_run on exit.

    Every stage gets `parent_run_id`; `arguments` are the workflow parameters.
    """
    w = lineage_workflow(cfg, prefix=prefix, title=title, description=description)
    if arguments:
        w.arguments = arguments
    with w:
        start = start_run_template(cfg)
        finish_run_template(cfg)
        dags = [s.add(cfg) for s in stages]
        with DAG(name="main"):
            task = start(name=START_TASK)
            for s, dag in zip(stages, dags, strict=True):
                task = task >> dag(
                    name=s.name, arguments={**s.arguments, "parent_run_id": PARENT_RUN_ID}
                )
    return w

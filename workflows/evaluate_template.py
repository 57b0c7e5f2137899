"""Event-driven evaluation: a WorkflowTemplate for one checkpoint, triggered by MinIO.

When a save commits, the engine writes `<run-root>/ckpt/step-XXXXXXXX/COMMIT` last. MinIO
reports that object to an Argo Events EventSource (bucket notification, suffix `/COMMIT`);
a Sensor turns the object key into the run root and step with Go templates and submits a
Workflow from the `ckptflow-evaluate` WorkflowTemplate with them:

    key  runs/<run>/pretrain/ckpt/step-00000120/COMMIT
    ->   run_root = s3://<bucket>/runs/<run>/pretrain, step = 120

`ckptflow.steps.evaluate --step N` is idempotent (results live next to the checkpoint), so a
checkpoint that the in-DAG background evaluator already did costs one quick no-op pod.
EventSource and Sensor are Argo Events resources, rendered as plain dicts (hera models only
Argo Workflows); the S3 keys come from the same Kubernetes Secret as the steps'.
"""

from __future__ import annotations

from urllib.parse import urlparse

from ckptflow.workflows import templates
from ckptflow.workflows.config import ConfigError, PipelineConfig, PlatformConfig, Resources
from ckptflow.workflows.templates import param, step
from hera.workflows import DAG, Container, Parameter, WorkflowTemplate

from ckptflow.contract import EvaluateArgs, to_argv

EVENT_NAME = "checkpoint-commits"
DEPENDENCY = "commit"
EVENTS_API = "argoproj.io/v1alpha1"
# The notification record inside the event data (Argo Events' MinIO event payload).
_RECORD = "(index .Input.notification 0).s3"


def evaluator(
    name: str,
    args: EvaluateArgs,
    inputs: tuple[str, ...],
    *,
    platform: PlatformConfig,
    resources: Resources,
    retries: int,
    deadline_s: int | None = None,
    timeout: str | None = None,
    backoff_s: int = 10,
    daemon: bool = False,
) -> Container:
    """A `ckptflow.steps.evaluate` template: the pretraining DAG's background one (following
    the run) or this WorkflowTemplate's (one step). Each input becomes the argument of the same
    name, filled in by Argo (`parent_run_id` is `--mlflow-parent-run-id`)."""
    field_of = {"parent_run_id": "mlflow_parent_run_id"}
    exprs = {field_of.get(n, n): param(n) for n in inputs}
    return step(
        name,
        "evaluate",
        to_argv(args, **exprs),
        platform=platform,
        resources=resources,
        inputs=inputs,
        output_names=EvaluateArgs.OUTPUTS,
        retries=retries,
        backoff_s=backoff_s,
        deadline_s=deadline_s,
        timeout=timeout,
        daemon=daemon,
    )


def build_evaluate(cfg: PipelineConfig) -> WorkflowTemplate:
    """A WorkflowTemplate evaluating one checkpoint: arguments run_root and step."""
    e, p = cfg.evaluate, cfg.platform
    w = WorkflowTemplate(
        name=e.template_name,
        entrypoint="main",
        arguments=[Parameter(name="run_root"), Parameter(name="step")],
        labels={"app.kubernetes.io/part-of": "ckptflow"},
        **templates.workflow_kwargs(
            p,
            title="ckptflow evaluate: one checkpoint",
            description="evaluate a committed checkpoint (triggered by its COMMIT marker)",
        ),
    )
    with w:
        evaluate = evaluator(
            "evaluate",
            e.evaluator,
            ("run_root", "step"),
            platform=p,
            resources=e.resources,
            retries=e.retries,
            deadline_s=e.deadline_s,
        )
        with DAG(name="main"):
            evaluate(
                name="evaluate",
                arguments={
                    "run_root": "{{workflow.parameters.run_root}}",
                    "step": "{{workflow.parameters.step}}",
                },
            )
    return w


def _bucket_and_prefix(cfg: PipelineConfig) -> tuple[str, str]:
    url = urlparse(cfg.platform.storage_root)
    if url.scheme != "s3" or not url.netloc:
        raise ConfigError(
            f"evaluate needs an s3:// storage root for MinIO events, got "
            f"{cfg.platform.storage_root!r}; set platform.storage_root=s3://BUCKET/PREFIX"
        )
    prefix = url.path.strip("/")
    return url.netloc, f"{prefix}/" if prefix else ""


def event_source(cfg: PipelineConfig) -> dict:
    """The Argo Events EventSource: MinIO notifications for new commit markers."""
    e, p = cfg.evaluate, cfg.platform
    bucket, prefix = _bucket_and_prefix(cfg)
    endpoint = urlparse(p.s3_endpoint)
    if not endpoint.netloc:
        raise ConfigError(
            "evaluate needs platform.s3_endpoint (the MinIO URL), e.g. http://minio:9000"
        )
    if not p.s3_secret:
        raise ConfigError(
            "evaluate needs platform.s3_secret: the EventSource reads MinIO keys from it"
        )
    return {
        "apiVersion": EVENTS_API,
        "kind": "EventSource",
        "metadata": {"name": e.event_source_name, "namespace": p.namespace},
        "spec": {
            "minio": {
                EVENT_NAME: {
                    "bucket": {"name": bucket},
                    "endpoint": endpoint.netloc,
                    "events": list(e.events),
                    "filter": {"prefix": prefix, "suffix": f"/{e.marker}"},
                    "insecure": e.minio_insecure,
                    "accessKey": {"name": p.s3_secret, "key": p.s3_access_key_key},
                    "secretKey": {"name": p.s3_secret, "key": p.s3_secret_key_key},
                }
            }
        },
    }


def sensor(cfg: PipelineConfig) -> dict:
    """The Argo Events Sensor: each commit marker submits the evaluate WorkflowTemplate."""
    e, p = cfg.evaluate, cfg.platform
    key = f"{_RECORD}.object.key"
    run_root = (
        f"s3://{{{{ {_RECORD}.bucket.name }}}}/"
        f'{{{{ {key} | trimSuffix "/{e.marker}" | dir | dir }}}}'
    )
    step_no = f'{{{{ {key} | dir | base | trimPrefix "step-" | atoi }}}}'
    workflow = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {
            "generateName": f"{e.template_name}-",
            "namespace": p.namespace,
            "labels": {"app.kubernetes.io/part-of": "ckptflow"},
        },
        "spec": {
            "workflowTemplateRef": {"name": e.template_name},
            "arguments": {"parameters": [{"name": "run_root"}, {"name": "step"}]},
        },
    }

    def from_event(template: str, index: int) -> dict:
        return {
            "src": {"dependencyName": DEPENDENCY, "dataTemplate": template},
            "dest": f"spec.arguments.parameters.{index}.value",
        }

    return {
        "apiVersion": EVENTS_API,
        "kind": "Sensor",
        "metadata": {"name": e.sensor_name, "namespace": p.namespace},
        "spec": {
            "template": {"serviceAccountName": e.sensor_service_account},
            "dependencies": [
                {
                    "name": DEPENDENCY,
                    "eventSourceName": e.event_source_name,
                    "eventName": EVENT_NAME,
                }
            ],
            "triggers": [
                {
                    "template": {
                        "name": "evaluate-checkpoint",
                        "argoWorkflow": {
                            "operation": "submit",
                            "source": {"resource": workflow},
                            "parameters": [from_event(run_root, 0), from_event(step_no, 1)],
                        },
                    },
                    "retryStrategy": {"steps": 3},
                }
            ],
        },
    }


def build_evaluate_manifests(cfg: PipelineConfig) -> list[dict]:
    """WorkflowTemplate, EventSource and Sensor, in the order to apply them."""
    return [build_evaluate(cfg).to_dict(), event_source(cfg), sensor(cfg)]

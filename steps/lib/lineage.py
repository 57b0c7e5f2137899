"""MLflow lineage that never kills training.

One parent run per pipeline run (`start_run`), a child run per step (nested with the
`mlflow.parentRunId` tag), named after what it runs (`finetune-lr0.001-freeze1`). The experiment
is marked as model training (`mlflow.experimentKind`), so MLflow 3's UI opens it on runs and
models, not in GenAI mode. Every committed checkpoint becomes an *external* LoggedModel: its
weights stay in our storage, MLflow holds its step, URI, manifest hash and sizes; it is an
*output* of the run that saved it and an *input* of the runs that evaluate it, fine-tune from
it or select it, and the evaluator logs metrics against its `model_id`, so MLflow's models view
ranks checkpoints. Each run links to its Argo workflow (`ckptflow.argo_url`, and the run's
description) when the step knows the Argo UI (`CKPTFLOW_ARGO_UI`).

Every call goes through `mlflow_calls.MlflowCalls`: a few quick retries, then a warning, and
the call is queued (or skipped, for lookups) while MLflow is treated as down for `cooldown_s`;
the queue is replayed at the next call after that, and at `close()`. Values that look like
secrets (`env.secret_values()`) are replaced before anything is sent.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable

# MAX_PARAM_LEN and run_label are re-exported: the steps take them from here
from ckptflow.steps.lib.lineage_values import MAX_PARAM_LEN as MAX_PARAM_LEN
from ckptflow.steps.lib.lineage_values import checkpoint_model_name, flatten, scrub, workflow_tags
from ckptflow.steps.lib.lineage_values import run_label as run_label
from ckptflow.steps.lib.mlflow_calls import MlflowCalls

from ckptflow import env

log = logging.getLogger("ckptflow.lineage")

EXPERIMENT = "ckptflow"
TAG_CKPT_URI = "ckptflow.ckpt_uri"
TAG_STEP_KIND = "ckptflow.step"
TAG_EXTERNAL = "mlflow.model.isExternal"  # what mlflow.create_external_model sets
MODEL_TYPE = "ckptflow-checkpoint"
# MLflow 3's experiment type: without it the UI guesses, and an empty experiment opens in GenAI
# mode ("Agent versions", "Traces"); `custom_model_development` is its model-training mode.
TAG_EXPERIMENT_KIND = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"


def default_tracking_uri(run_root: str | None) -> str | None:
    """MLFLOW_TRACKING_URI, else a SQLite store under a local run root, else None (disabled)."""
    if env.mlflow_tracking_uri():
        return env.mlflow_tracking_uri()
    if run_root and ("://" not in run_root or run_root.startswith("file://")):
        path = os.path.abspath(run_root.removeprefix("file://"))
        os.makedirs(path, exist_ok=True)
        return f"sqlite:///{path}/mlflow.db"
    return None


class Lineage:
    """MLflow for one step: a run, its params, metrics and checkpoint models; never raises."""

    def __init__(
        self,
        tracking_uri: str | None,
        *,
        artifact_root: str | None = None,
        retries: int = 3,
        backoff_s: float = 0.5,
        cooldown_s: float = 30.0,
        max_queue: int = 10_000,
    ):
        self.tracking_uri = tracking_uri
        self.artifact_root = artifact_root
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.run_name: str = ""
        self.warnings: list[str] = []
        self._calls = MlflowCalls(
            tracking_uri is not None,
            self._warn,
            retries=retries,
            backoff_s=backoff_s,
            cooldown_s=cooldown_s,
            max_queue=max_queue,
        )
        self._client = None
        self._datasets: set[tuple] = set()  # (task, seed, context) logged on this run
        if tracking_uri is None:
            self._warn("MLflow disabled: set MLFLOW_TRACKING_URI (or use a local run root)")

    @classmethod
    def for_run_root(cls, run_root: str | None, **kw) -> Lineage:
        uri = default_tracking_uri(run_root)
        local = uri is not None and uri.startswith("sqlite:///") and not env.mlflow_tracking_uri()
        art = (
            os.path.join(os.path.dirname(uri.removeprefix("sqlite:///")), "mlartifacts")
            if local
            else None
        )
        return cls(uri, artifact_root=art, **kw)

    # -- the client and its calls --------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        return self.tracking_uri is not None

    @property
    def client(self):
        if self._client is None:
            env.limit_mlflow_http_retries()
            from mlflow import MlflowClient  # imported lazily: it costs seconds

            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def _warn(self, msg: str) -> None:
        self.warnings.append(msg)
        log.warning("%s", msg)

    def _call(self, what: str, fn: Callable, *, queue: bool = True):
        """fn() through the retries and queue; None when it failed (see mlflow_calls)."""
        return self._calls.call(what, fn, queue=queue)

    @property
    def pending(self) -> int:
        return self._calls.pending

    # -- runs ----------------------------------------------------------------------------------
    def _experiment(self, name: str) -> str:
        """The experiment's id, created (marked as model training) when missing; an existing
        one without a type is marked too, one whose type a user chose is left as it is."""
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            try:
                return self.client.create_experiment(
                    name,
                    artifact_location=self.artifact_root,
                    tags={TAG_EXPERIMENT_KIND: MODEL_TRAINING},
                )
            except Exception:  # another step created it concurrently
                exp = self.client.get_experiment_by_name(name)
                if exp is None:
                    raise
        if TAG_EXPERIMENT_KIND not in (exp.tags or {}):
            self.client.set_experiment_tag(exp.experiment_id, TAG_EXPERIMENT_KIND, MODEL_TRAINING)
        return exp.experiment_id

    def start_run(
        self,
        run_name: str,
        *,
        experiment: str = EXPERIMENT,
        parent_run_id: str | None = None,
        step_kind: str = "",
        tags: dict | None = None,
        params: dict | None = None,
    ) -> str | None:
        """Create this step's run (nested under `parent_run_id` when given); returns its id."""
        self.run_name = run_name
        all_tags = {**workflow_tags(), **(tags or {})}
        if step_kind:
            all_tags[TAG_STEP_KIND] = step_kind

        def create():
            if parent_run_id:
                parent = self.client.get_run(parent_run_id)
                self.experiment_id = parent.info.experiment_id
                all_tags["mlflow.parentRunId"] = parent_run_id
            else:
                self.experiment_id = self._experiment(experiment)
            run = self.client.create_run(
                self.experiment_id, run_name=run_name, tags=scrub(all_tags)
            )
            return run.info.run_id

        self.run_id = self._call("create run", create, queue=False)
        if self.run_id and params:
            self.log_params(params)
        return self.run_id

    def attach(self, run_id: str) -> None:
        """Use an existing run (e.g. finish_run closing the parent)."""
        self.run_id = run_id

    def log_params(self, params: dict) -> None:
        from mlflow.entities import Param

        if not self.run_id:
            return
        items = [Param(k, v) for k, v in scrub(flatten(params)).items()]
        rid = self.run_id
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            chunk = items[i : i + 100]
            self._call("log params", lambda c=chunk: self.client.log_batch(rid, params=c))

    def set_tags(self, tags: dict) -> None:
        if not self.run_id:
            return
        rid = self.run_id
        for k, v in scrub(tags).items():
            self._call(f"tag {k}", lambda k=k, v=v: self.client.set_tag(rid, k, v))

    def log_metrics(self, metrics: dict, step: int, model_id: str | None = None) -> None:
        """Metrics of one step (one batched call); linked to a LoggedModel when `model_id`."""
        from mlflow.entities import Metric

        if not self.run_id:
            return
        ts = int(time.time() * 1000)
        items = [
            Metric(k, float(v), ts, int(step), model_id=model_id)
            for k, v in metrics.items()
            if isinstance(v, int | float)
        ]
        rid = self.run_id
        self._call("log metrics", lambda: self.client.log_batch(rid, metrics=items))

    def end_run(self, status: str = "FINISHED") -> None:
        rid = self.run_id
        if rid:
            self._call("end run", lambda: self.client.set_terminated(rid, status))

    def flush(self) -> bool:
        """One last attempt to send what is queued; what still fails is dropped (warned)."""
        return self._calls.flush()

    def close(self, status: str = "FINISHED") -> None:
        """End the run, then flush the queue."""
        self.end_run(status)
        self.flush()

    # -- checkpoints as LoggedModels -----------------------------------------------------------
    def begin_checkpoint(self, step: int, uri: str) -> str | None:
        """A PENDING external LoggedModel for a checkpoint about to be saved; returns model_id.

        Created before the save so the id can go into the checkpoint's own metadata, which is
        how the evaluator (another process) links its metrics to this model.
        """
        if not self.run_id:
            return None
        rid, eid = self.run_id, self.experiment_id

        def create():
            m = self.client.create_logged_model(
                experiment_id=eid,
                name=checkpoint_model_name(self.run_name, step),
                source_run_id=rid,
                tags=scrub({TAG_EXTERNAL: "true", TAG_CKPT_URI: uri, "ckptflow.step_number": step}),
                model_type=MODEL_TYPE,
            )
            return m.model_id

        model_id = self._call("create logged model", create, queue=False)
        if model_id:  # the run's "Logged models": MLflow's own run -> model lineage
            from mlflow.entities import LoggedModelOutput

            out = [LoggedModelOutput(model_id, int(step))]
            self._call("log model output", lambda: self.client.log_outputs(rid, out))
        return model_id

    def log_checkpoint(
        self, step: int, uri: str, manifest_hash: str, sizes: dict, model_id: str | None = None
    ) -> str | None:
        """Record a committed checkpoint as a READY external LoggedModel; returns its model_id."""
        model_id = model_id or self.begin_checkpoint(step, uri)
        if model_id is None:
            return None
        params = scrub({"step": step, "uri": uri, "manifest_hash": manifest_hash, **sizes})

        def finish():
            from mlflow.entities import LoggedModelStatus

            self.client.log_model_params(model_id, params)
            self._log_external_spec(model_id)
            self.client.finalize_logged_model(model_id, LoggedModelStatus.READY)

        self._call("finalize logged model", finish)
        return model_id

    def fail_checkpoint(self, model_id: str | None, reason: str) -> None:
        if model_id:
            from mlflow.entities import LoggedModelStatus

            self._call(
                "fail logged model",
                lambda: self.client.finalize_logged_model(model_id, LoggedModelStatus.FAILED),
            )
            self._call(
                "tag logged model",
                lambda: self.client.set_logged_model_tags(
                    model_id, {"ckptflow.error": reason[:500]}
                ),
            )

    def set_model_tags(self, model_id: str | None, tags: dict) -> None:
        """Tags on a checkpoint's LoggedModel (scrubbed); nothing without a model_id."""
        if model_id:
            clean = scrub(tags)
            self._call(
                "tag logged model",
                lambda: self.client.set_logged_model_tags(model_id, clean),
            )

    def log_input_model(self, model_id: str | None, role: str) -> None:
        """A LoggedModel as an input of this run (MLflow's own lineage: the checkpoint it used,
        e.g. the `base` of a fine-tune, an `evaluated` one, the `chosen` one of select)."""
        if not (model_id and self.run_id):
            return
        from mlflow.entities import LoggedModelInput

        rid = self.run_id
        self._call(
            f"log {role} model input",
            lambda: self.client.log_inputs(rid, models=[LoggedModelInput(model_id)]),
        )

    def log_dataset(self, task: str, seed: int, context: str) -> None:
        """The generated corpus this run reads (steps.lib.data: the task and the seed decide
        every sample) as a dataset input of the run, for MLflow's lineage and its Datasets
        column; `context` is MLflow's `mlflow.data.context` tag (training, evaluation)."""
        if not (task and self.run_id) or (task, seed, context) in self._datasets:
            return  # an evaluator scores many checkpoints on one corpus: logged once
        self._datasets.add((task, seed, context))
        from mlflow.data.code_dataset_source import CodeDatasetSource
        from mlflow.data.meta_dataset import MetaDataset
        from mlflow.entities import DatasetInput, InputTag
        from mlflow.types import ColSpec, Schema

        source = CodeDatasetSource(
            {"generator": "ckptflow.steps.lib.data", "task": task, "seed": str(seed)}
        )
        data = MetaDataset(source, name=f"{task}-seed{seed}", schema=Schema([ColSpec("string")]))
        inp = DatasetInput(data._to_mlflow_entity(), [InputTag("mlflow.data.context", context)])
        rid = self.run_id
        self._call("log dataset input", lambda: self.client.log_inputs(rid, datasets=[inp]))

    def log_artifact_bytes(self, name: str, data: bytes, run_id: str | None = None) -> None:
        """A file (the run report) as an artifact of `run_id` (default: this step's run)."""
        rid = run_id or self.run_id
        if not rid:
            return

        def send():
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, name)
                with open(path, "wb") as fh:
                    fh.write(data)
                self.client.log_artifact(rid, path)

        self._call(f"log artifact {name}", send)

    def _log_external_spec(self, model_id: str) -> None:
        """The stub MLmodel file create_external_model writes, so the model can be registered."""
        from mlflow.models.utils import get_external_mlflow_model_spec

        spec = get_external_mlflow_model_spec(self.client.get_logged_model(model_id))
        with tempfile.TemporaryDirectory() as tmp:
            spec.save(os.path.join(tmp, "MLmodel"))
            self.client.log_model_artifacts(model_id, tmp)

    def find_checkpoint_model(self, uri: str) -> str | None:
        """The model_id of the LoggedModel recorded for checkpoint `uri` (None when absent)."""
        if not self.experiment_id:
            return None

        def search():
            found = self.client.search_logged_models(
                [self.experiment_id], filter_string=f"tags.`{TAG_CKPT_URI}` = '{uri}'"
            )
            return min(found, key=lambda m: m.creation_timestamp).model_id if found else None

        return self._call("search logged models", search, queue=False)

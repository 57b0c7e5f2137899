"""The registered model as an MLflow `pyfunc`: prompts in, greedy completions out.

Select registers this, not the checkpoint's external LoggedModel (a stub MLflow cannot load):
a LoggedModel of select's run whose artifacts are the export folder (weights and config.json)
and an `MLmodel` of the python_function flavor, so

    mlflow.pyfunc.load_model("models:/ckptflow-tiny@champion").predict(["07+12="])  # ["019;"]

works wherever ckptflow's steps (torch) are installed: the model's code is
`GPTModel` below, imported at load, not a copy pickled into the model.
"""

from __future__ import annotations

import os
import tempfile

import mlflow
from mlflow.pyfunc import PythonModel

from ckptflow import env

ARTIFACT = "export"  # the artifact key: the export folder
PROMPT = "prompt"
MODEL_TYPE = "ckptflow-pyfunc"
# the signature MLflow infers from predict's type hints and this example: a list of prompts
# (strings) -> a list of completions (strings); param max_new_tokens (long, default 8)
EXAMPLE = (["07+12="], {"max_new_tokens": 8})
MAX_EXPORT_FILES = 10_000
CODE = os.path.join(os.path.dirname(__file__), "pyfunc_code.py")


def _prompts(model_input) -> list[str]:
    """The prompts of a pyfunc input: a DataFrame's `prompt` column, a list or one string."""
    if hasattr(model_input, "columns"):  # pandas, after MLflow's schema enforcement
        col = PROMPT if PROMPT in model_input.columns else model_input.columns[0]
        return [str(v) for v in model_input[col].tolist()]
    if isinstance(model_input, str):
        return [model_input]
    if isinstance(model_input, dict) and PROMPT in model_input:
        return _prompts(model_input[PROMPT])
    return [str(v) for v in model_input]


class GPTModel(PythonModel):
    """ckptflow's GPT behind MLflow's pyfunc interface (loaded from the `export` artifact)."""

    def load_context(self, context) -> None:
        from ckptflow.steps.lib.generation import load_export

        self.model = load_export(context.artifacts[ARTIFACT])

    def predict(self, context, model_input: list[str], params: dict | None = None) -> list[str]:
        from ckptflow.steps.lib.generation import DEFAULT_NEW_TOKENS, complete

        n = int((params or {}).get("max_new_tokens") or DEFAULT_NEW_TOKENS)
        return complete(self.model, _prompts(model_input), n)


def requirements() -> list[str]:
    """What loading needs (named, not inferred: inference loads the model in a subprocess);
    ckptflow itself is installed from its source (`pip install 'ckptflow[steps]'`)."""
    from importlib.metadata import version

    return [f"{d}=={version(d)}" for d in ("torch", "safetensors", "numpy", "mlflow")]


def copy_export(export_uri: str, dest: str) -> str:
    """The export folder's files (any storage URI) copied into local folder `dest`."""
    src = env.open_storage(export_uri)
    names = [n for n in src.listdir() if src.is_file(n)]
    if not names or len(names) > MAX_EXPORT_FILES:
        raise ValueError(f"{src.url()}: {len(names)} files, not an export folder")
    os.makedirs(dest, exist_ok=True)
    for name in names:
        with open(os.path.join(dest, name), "wb") as fh:
            fh.write(src.read(name))
    return dest


def save(export_uri: str, path: str) -> str:
    """A pyfunc model at local `path` whose artifact is a copy of the export folder."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = copy_export(export_uri, os.path.join(tmp, ARTIFACT))
        mlflow.pyfunc.save_model(
            path,
            python_model=CODE,  # models from code: no pickled object in the model
            artifacts={ARTIFACT: folder},
            pip_requirements=requirements(),
            input_example=EXAMPLE,
        )
    return path


def log(
    client, *, experiment_id: str, run_id: str | None, name: str, export_uri: str, tags: dict
) -> str:
    """A READY LoggedModel (an output of `run_id`) holding the pyfunc model of the export;
    returns its model_id. Raises on failure: select says so and registers nothing."""
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus

    model = client.create_logged_model(
        experiment_id=experiment_id,
        name=name,
        source_run_id=run_id,
        tags={k: str(v) for k, v in tags.items()},
        model_type=MODEL_TYPE,
    )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            client.log_model_artifacts(model.model_id, save(export_uri, os.path.join(tmp, "m")))
        client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
    except Exception:
        client.finalize_logged_model(model.model_id, LoggedModelStatus.FAILED)
        raise
    if run_id:
        client.log_outputs(run_id, [LoggedModelOutput(model.model_id, 0)])
    return model.model_id

"""The MLflow "model from code" of a registered ckptflow model: MLflow copies this file into
the model and runs it at load, which imports `GPTModel` from the installed ckptflow (so the
model's code is ckptflow's own, never an object unpickled from the model's folder)."""

from ckptflow.steps.lib.pyfunc_model import GPTModel
from mlflow.models import set_model

set_model(GPTModel())

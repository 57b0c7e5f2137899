"""The registered model is a copy MLflow owns: `ckptflow run pipeline --local --s3` exports to
an in-process S3 server that ends with the command, and the champion must still load and answer
afterwards (`mlflow.pyfunc.load_model`), from MLflow's artifact store on disk."""

from __future__ import annotations

import shutil
import socket

import mlflow
import pytest
import torch
from ckptflow.steps.lib import generation, pyfunc_model, registry
from ckptflow.steps.lib.export import export_weights
from ckptflow.steps.lib.model import GPT, config_for
from ckptflow.workflows.local_services import S3_BUCKET, S3_KEYS, start_s3

from ckptflow import env
from tests.steps.test_finetune import mlflow_template  # noqa: F401

PROMPTS = ["07+12=", "R12345="]


@pytest.mark.s3
def test_the_champion_loads_after_the_in_process_s3_is_gone(
    tmp_path,
    monkeypatch,
    mlflow_template,  # noqa: F811
):
    torch.manual_seed(5)
    model = GPT(config_for("tiny")).eval()
    server, endpoint = start_s3()
    try:
        for k, v in {**S3_KEYS, "AWS_ENDPOINT_URL": endpoint}.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        uri = f"s3://{S3_BUCKET}/runs/x/export/a-step-00000008-fp32"
        export_weights(model.state_dict(), model.cfg.to_dict(), uri)
        shutil.copy(mlflow_template, tmp_path / "mlflow.db")
        db = f"sqlite:///{tmp_path}/mlflow.db"
        client = registry.client_for(db)
        exp = client.create_experiment("t", artifact_location=str(tmp_path / "mlruns"))
        run = client.create_run(exp).info.run_id
        mid = pyfunc_model.log(
            client, experiment_id=exp, run_id=run, name="a", export_uri=uri, tags={}
        )
        registry.register(
            client, "m", source=uri, run_id=run, metric="x", value=1, mode="max", tags={},
            model_id=mid,
        )  # fmt: skip
    finally:
        server.stop()
    host, port = endpoint.removeprefix("http://").split(":")
    with pytest.raises(ConnectionRefusedError):  # the export went with the server
        socket.create_connection((host, int(port)), timeout=5).close()
    for k in (*S3_KEYS, "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k)
    with env.mlflow_default_store(db):  # for the load only: MLflow exports it
        champ = mlflow.pyfunc.load_model("models:/m@champion")
    assert champ.predict(PROMPTS) == generation.complete(model, PROMPTS)

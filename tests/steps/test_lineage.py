"""MLflow lineage against a real (SQLite) tracking store, queried with MLflow's own client."""

from __future__ import annotations

import os
import shutil
import socket
import time

import pytest
from ckptflow.steps import finish_run, start_run
from ckptflow.steps.lib import lineage as lin
from mlflow import MlflowClient
from mlflow.entities import LoggedModelStatus


@pytest.fixture(scope="module")
def blank_db(tmp_path_factory):
    """An initialised, empty tracking DB; copying it spares each test the schema migration."""
    d = tmp_path_factory.mktemp("blankdb")
    MlflowClient(tracking_uri=f"sqlite:///{d}/mlflow.db").search_experiments()
    return d / "mlflow.db"


@pytest.fixture
def run_root(tmp_path, blank_db, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    shutil.copy(blank_db, tmp_path / "mlflow.db")
    return str(tmp_path)


def client_for(run_root: str) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{run_root}/mlflow.db")


def test_default_tracking_uri(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert lin.default_tracking_uri(str(tmp_path)) == f"sqlite:///{tmp_path}/mlflow.db"
    assert lin.default_tracking_uri("s3://bucket/run") is None  # no local place for a DB
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    assert lin.default_tracking_uri(str(tmp_path)) == "http://mlflow:5000"


def test_parent_and_child_runs_with_workflow_tags_and_scrubbed_config(
    run_root, monkeypatch, tmp_path
):
    monkeypatch.setenv("ARGO_WORKFLOW_NAME", "pipe-abc12")
    monkeypatch.setenv("ARGO_WORKFLOW_UID", "uid-123")
    monkeypatch.setenv("ARGO_WORKFLOW_NAMESPACE", "ml")
    monkeypatch.setenv("CKPTFLOW_IMAGE", "ckptflow:1.2")
    monkeypatch.setenv("CKPTFLOW_GIT_COMMIT", "deadbeef")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value")
    config = '{"pretrain": {"lr": 0.003, "steps": 40}, "s3": {"note": "key s3cr3t-value"}}'
    out = tmp_path / "out"
    assert (
        start_run.main(
            [
                "--experiment",
                "exp1",
                "--run-name",
                "pipe-abc12",
                "--config-json",
                config,
                "--run-root",
                run_root,
                "--output-dir",
                str(out),
            ]
        )
        == 0
    )
    parent_id = (out / "run_id").read_text()
    child = lin.Lineage.for_run_root(run_root)
    child_id = child.start_run(
        "pretrain", parent_run_id=parent_id, step_kind="pretrain", params={"lr": 0.003}
    )
    child.close()
    assert (
        finish_run.main(["--run-id", parent_id, "--status", "Succeeded", "--run-root", run_root])
        == 0
    )

    c = client_for(run_root)
    parent, kid = c.get_run(parent_id), c.get_run(child_id)
    assert (
        parent.data.params["pretrain.lr"] == "0.003"
        and parent.data.params["pretrain.steps"] == "40"
    )
    assert parent.data.params["s3.note"] == "key ***"  # a secret value never reaches MLflow
    for run in (parent, kid):
        tags = run.data.tags
        assert tags["ckptflow.workflow_name"] == "pipe-abc12"
        assert tags["ckptflow.workflow_uid"] == "uid-123" and tags["ckptflow.namespace"] == "ml"
    assert kid.data.tags["ckptflow.image"] == "ckptflow:1.2"
    assert kid.data.tags["ckptflow.git_commit"] == "deadbeef"
    assert kid.data.tags["mlflow.parentRunId"] == parent_id
    assert kid.info.experiment_id == parent.info.experiment_id
    assert parent.info.status == "FINISHED" and kid.info.status == "FINISHED"


def test_checkpoint_becomes_an_external_logged_model_with_linked_metrics(run_root):
    lg = lin.Lineage.for_run_root(run_root)
    run_id = lg.start_run("pretrain")
    uri = f"{run_root}/ckpt/step-00000010"
    pending = lg.begin_checkpoint(10, uri)
    model_id = lg.log_checkpoint(
        10, uri, "abc123", {"kind": "full", "stored_bytes": 1234}, model_id=pending
    )
    assert model_id == pending
    lg.log_metrics({"train_loss": 1.5}, 10)
    lg.log_metrics({"val_loss": 1.25, "exact_match": 0.5}, 10, model_id=model_id)
    assert lg.find_checkpoint_model(uri) == model_id
    assert lg.find_checkpoint_model(uri + "x") is None
    lg.close()

    c = client_for(run_root)
    m = c.get_logged_model(model_id)
    assert m.status == LoggedModelStatus.READY and m.source_run_id == run_id
    assert m.tags["mlflow.model.isExternal"] == "true"
    assert m.params == {
        "step": "10",
        "uri": uri,
        "manifest_hash": "abc123",
        "kind": "full",
        "stored_bytes": "1234",
    }
    assert {(x.key, x.value, x.step) for x in m.metrics} == {
        ("val_loss", 1.25, 10),
        ("exact_match", 0.5, 10),
    }
    assert os.path.exists(f"{run_root}/mlartifacts")  # artifacts of the local store stay local
    ranked = c.search_logged_models(
        [m.experiment_id], order_by=[{"field_name": "metrics.val_loss"}]
    )
    assert [x.model_id for x in ranked] == [model_id]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_never_raises_and_costs_little_time():
    lg = lin.Lineage(f"http://127.0.0.1:{_closed_port()}", retries=2, backoff_s=0.01, cooldown_s=60)
    t0 = time.monotonic()
    assert lg.start_run("pretrain", params={"a": 1}) is None
    for step in range(50):
        lg.log_metrics({"loss": 1.0}, step)
    assert lg.log_checkpoint(1, "/x", "h", {}) is None
    lg.close()
    assert time.monotonic() - t0 < 30
    assert any("unreachable" in w for w in lg.warnings)


def test_outage_mid_run_queues_calls_and_replays_them(run_root):
    lg = lin.Lineage.for_run_root(run_root, retries=1, backoff_s=0.0, cooldown_s=0.0)
    run_id = lg.start_run("pretrain")
    lg.log_metrics({"loss": 3.0}, 1)
    db = f"{run_root}/mlflow.db"
    os.rename(db, db + ".away")  # the store disappears mid-run
    with open(db, "wb"):
        pass  # an empty file: every call now fails
    lg.log_metrics({"loss": 2.0}, 2)
    assert lg.pending == 1 and "queued" in lg.warnings[-1]
    os.replace(db + ".away", db)  # it comes back
    lg.log_metrics({"loss": 1.0}, 3)
    assert lg.pending == 0
    lg.close()
    history = client_for(run_root).get_metric_history(run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 3.0), (2, 2.0), (3, 1.0)]


def test_a_rejected_call_is_skipped_not_queued(run_root):
    lg = lin.Lineage.for_run_root(run_root, retries=3, backoff_s=0.0)
    run_id = lg.start_run("pretrain", params={"lr": 0.1})
    lg.log_params({"lr": 0.2})  # MLflow params are immutable: a client error, not an outage
    assert lg.pending == 0 and "rejected" in lg.warnings[-1]
    lg.log_metrics({"loss": 1.0}, 1)  # and MLflow is not treated as down
    lg.close()
    run = client_for(run_root).get_run(run_id)
    assert run.data.params["lr"] == "0.1" and run.data.metrics["loss"] == 1.0


def test_input_models_and_model_tags_through_public_methods(run_root, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value")
    lg = lin.Lineage.for_run_root(run_root)
    lg.start_run("pretrain")
    model_id = lg.log_checkpoint(4, f"{run_root}/ckpt/step-00000004", "h", {})
    user = lin.Lineage.for_run_root(run_root)
    run_id = user.start_run("select")
    user.log_input_model(model_id, "chosen")
    user.log_input_model(None, "chosen")  # no model: nothing to link
    user.set_model_tags(model_id, {"ckptflow.base_step": 4, "note": "key s3cr3t-value"})
    user.set_model_tags(None, {"x": "y"})  # no model: nothing to tag
    lg.close()
    user.close()
    assert user.warnings == [] and user.pending == 0

    c = client_for(run_root)
    assert [m.model_id for m in c.get_run(run_id).inputs.model_inputs] == [model_id]
    tags = c.get_logged_model(model_id).tags
    assert tags["ckptflow.base_step"] == "4" and tags["note"] == "key ***"


def test_public_methods_without_a_run_or_server_send_nothing():
    lg = lin.Lineage(None)  # MLflow disabled
    lg.log_input_model("m-1", "base")
    lg.set_model_tags("m-1", {"a": 1})
    assert lg.pending == 0 and len(lg.warnings) == 1 and "disabled" in lg.warnings[0]

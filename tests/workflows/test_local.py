"""`ckptflow run pipeline --local`: the locally configured manifest is one the runner accepts,
and (slow) the whole pipeline runs through the local runner to a registered champion."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from ckptflow.workflows.local import S3_BUCKET, local_config, main, summary
from ckptflow.workflows.render import manifests
from ckptflow.workflows.runner.spec import validate


@pytest.mark.parametrize("s3", [None, "http://127.0.0.1:9"])
def test_local_manifest_is_runnable_by_the_local_runner(tmp_path, s3):
    cfg = local_config(tmp_path, s3_endpoint=s3, overrides=["pretrain.max_steps=12"])
    doc = manifests("pipeline", cfg)[0]
    validate(doc["spec"], env={})  # no Secret needed, no volume, nothing refused
    text = json.dumps(doc)
    assert "secretKeyRef" not in text and "/dev/shm" not in text
    # no Argo Server runs locally: no MLflow run may link to its UI (issue 38)
    assert "CKPTFLOW_ARGO_UI" not in text and cfg.platform.argo_ui == ""
    assert cfg.pretrain.train.max_steps == 12  # the user's --set wins over the small defaults
    assert cfg.platform.mlflow_tracking_uri == f"sqlite:///{tmp_path / 'mlflow.db'}"
    if s3:
        assert cfg.platform.storage_root == "s3://ckptflow-local/runs"
        assert cfg.platform.s3_endpoint == s3
    else:
        assert cfg.platform.storage_root == str(tmp_path)


def test_run_without_local_points_at_submit(capsys):
    assert main(["pipeline"]) == 2
    assert "--local" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "phrase"),
    [
        (["finetune", "--local"], "finetune needs a base to start from"),
        (["finetune", "--local", "--set", "finetune.base_root={tmp}/none"], "no such folder"),
        (["pipeline", "--local", "--set", "pretrain.model=huge"], "not one of tiny"),
        (["pipeline", "--local", "--set", "platform.pod_gc=Sometimes"], "OnPodSuccess"),
        (["pipeline", "--local", "-p", "rank=2"], "did you mean ranks?"),
        (["pipeline", "--local", "--from-template", "-p", "mode=up"], "not one of min, max"),
        (["finetune", "--local", "-p", "base_root={tmp}/none"], "no such folder"),
        (["pretrain", "--local", "-p", "metric=x"], "no such workflow parameter"),
        (["pipeline", "--local", "--name", "Bad_Name"], "--name 'Bad_Name'"),
    ],
)
def test_local_run_refuses_bad_settings_at_once_in_one_line(tmp_path, capsys, argv, phrase):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main([*argv, "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert phrase in err and err.count("\n") == 1
    assert not list((tmp_path / "runs").glob("*/workflow.yaml"))  # nothing was started


def _small_run(ckpt_storage) -> None:
    """Two committed steps under a pretraining checkpoint root, one evaluated, one with a
    damaged eval.json, and an uncommitted leftover."""
    import torch
    from ckptflow.steps.checkpoint import Checkpointer

    from ckptflow.core import runroot

    ck = Checkpointer(ckpt_storage.uri, storage=ckpt_storage)
    for step in (10, 20):
        ck.save(step, {"w": torch.full((4,), float(step))})
    runroot.write_eval(ck.storage, runroot.EvalRecord(10, metrics={"val_loss": 1.5}))
    ck.storage.write(runroot.eval_path(20), b"[" * 10_000)
    ck.storage.write("step-00000030/saving-0123456789abcdef.json", b"{}")


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_summary_reads_the_run_with_the_format_core(tmp_path):
    from ckptflow.core.storage import Storage

    cfg = local_config(tmp_path, s3_endpoint=None, overrides=[])
    _small_run(Storage(f"{tmp_path}/run1/pretrain/ckpt"))
    text = summary(cfg, "run1", SimpleNamespace(nodes={}), tmp_path, {})
    assert f"pretrain: 2 committed checkpoints  ({tmp_path}/run1/pretrain/ckpt)" in text
    assert "    step     10  val_loss=1.5" in text.splitlines()
    assert "    step     20  " in text.splitlines()  # no metrics: its record is damaged
    assert f"unreadable evaluation: {tmp_path}/run1/pretrain/ckpt/step-00000020/eval.json" in text
    assert f"ckptflow ckpt ls {tmp_path}/run1/pretrain/ckpt" in text


@pytest.mark.s3
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_summary_reaches_the_in_process_s3_with_the_steps_keys(tmp_path, moto_server, monkeypatch):
    """The keys of the in-process S3 are only in the steps' environment, not this process's."""
    import boto3

    from ckptflow.core.storage import Storage, StorageOptions

    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    keys = {"AWS_ACCESS_KEY_ID": "ckptflow-local", "AWS_SECRET_ACCESS_KEY": "local-secret"}
    s3 = boto3.client(
        "s3",
        endpoint_url=moto_server,
        region_name="us-east-1",
        aws_access_key_id=keys["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"],
    )
    if S3_BUCKET not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        s3.create_bucket(Bucket=S3_BUCKET)
    cfg = local_config(tmp_path, s3_endpoint=moto_server, overrides=[])
    name = f"run-{uuid.uuid4().hex[:8]}"
    creds = (keys["AWS_ACCESS_KEY_ID"], keys["AWS_SECRET_ACCESS_KEY"])
    opts = StorageOptions(moto_server, credentials=creds)
    _small_run(Storage(f"{cfg.platform.storage_root}/{name}/pretrain/ckpt", options=opts))
    text = summary(cfg, name, SimpleNamespace(nodes={}), tmp_path, keys)
    assert "pretrain: 2 committed checkpoints" in text, text
    assert "step     10  val_loss=1.5" in text


@pytest.mark.slow
def test_whole_pipeline_runs_locally(tmp_path, capsys, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    runs = tmp_path / "runs"
    rc = main(["pipeline", "--local", "--runs-dir", str(runs), "--name", "local-e2e"])
    out = capsys.readouterr().out
    print(out, file=sys.stderr)
    assert rc == 0, out
    assert "champion:" in out and "MLflow UI:" in out
    assert list(elsewhere.iterdir()) == []  # everything the run wrote is under runs/
    assert (runs / "mlruns").is_dir()  # MLflow's artifacts too
    root = runs / "local-e2e"
    assert (root / "pretrain" / "FINISHED").exists()
    commits = sorted(p.parent.name for p in (root / "pretrain" / "ckpt").glob("step-*/COMMIT"))
    assert commits == [f"step-{s:08d}" for s in range(100, 801, 100)]
    for step in commits:  # the concurrent evaluator did each one
        assert (root / "pretrain" / "ckpt" / step / "eval.json").exists()
    assert any((root / "export").rglob("*.safetensors"))
    # the story: the model learned its task, each fine-tune beats the base on its own task
    last = json.loads((root / "pretrain" / "ckpt" / commits[-1] / "eval.json").read_text())
    assert last["metrics"]["exact_match"] >= 0.5, last
    for ev in (root / "finetune").glob("*/ckpt/step-00000600/eval.json"):
        rec = json.loads(ev.read_text())
        assert rec["metrics"]["val_loss"] < rec["base_metrics"]["val_loss"], rec
    assert (root / "report.png").read_bytes()[:4] == b"\x89PNG" and "<- selected" in out
    check_mlflow_links(f"sqlite:///{runs}/mlflow.db", "local-e2e")


def check_mlflow_links(db: str, workflow: str) -> None:
    """What the MLflow UI shows after the main job, read with MLflow's own client."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=db, registry_uri=db)
    exp = client.get_experiment_by_name("ckptflow")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # not GenAI mode
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    parent = runs[workflow]
    # no Argo UI runs locally: no run links to one (the workflow's name is still a tag)
    assert parent.data.tags["ckptflow.workflow_name"] == workflow
    children = {
        n for n, r in runs.items() if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
    }
    variants = {"finetune-lr0.01-freeze0", "finetune-lr0.003-freeze0"}
    steps = {"pretrain", "evaluate-pretrain-follow", "evaluate-pretrain-final", "select"}
    assert children == steps | variants, children  # every child, each named by what it is
    assert not [r for r in runs.values() if "ckptflow.argo_url" in r.data.tags]
    pre = client.get_run(runs["pretrain"].info.run_id)
    assert len(pre.outputs.model_outputs) == 8  # every checkpoint: an output of its run
    mv = client.get_model_version_by_alias("ckptflow-tiny", "champion")
    model = client.get_logged_model(mv.source.removeprefix("models:/"))
    assert json.loads(model.tags["mlflow.modelVersions"])[0]["version"] == str(mv.version)
    assert {m.key for m in model.metrics} >= {"val_loss", "exact_match"}
    assert [a.path for a in client.list_artifacts(parent.info.run_id)] == ["report.png"]


def test_printed_commands_work_from_any_directory(tmp_path):
    from ckptflow.workflows.local_summary import mlflow_ui_command

    cmd = mlflow_ui_command(Path("runs") / "mlflow.db")
    exe, _, _, uri = cmd.split()
    assert Path(exe).is_absolute() and Path(exe).exists()
    assert uri == f"sqlite:///{(Path('runs') / 'mlflow.db').resolve()}"


def test_the_printed_mlflow_link_opens_the_model_training_view(tmp_path):
    """MLflow 3's UI opens in GenAI mode unless the URL asks otherwise (the experiment's kind
    tag does not switch it: seen in headless-Chromium screenshots); the summary's link does."""
    import sqlite3

    from ckptflow.workflows.local_summary import mlflow_experiment_url

    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as con:
        con.execute("create table experiments (experiment_id integer, name text)")
        con.execute("insert into experiments values (7, 'ckptflow')")
    url = mlflow_experiment_url(db, "ckptflow")
    assert url == "http://127.0.0.1:5000/#/experiments/7?workflowType=machine_learning"
    assert mlflow_experiment_url(tmp_path / "none.db", "ckptflow") is None

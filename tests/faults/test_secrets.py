"""Secrets: recognisable fake credentials never appear in manifests, logs, MLflow params or tags,
or rendered Argo manifests.

The fast checks cover a checkpoint save on S3 (with those credentials in use) and every rendered
workflow; the slow one scans every file a full `ckptflow run pipeline --local` leaves behind
(checkpoints, eval results, pod logs, the workflow status, the rendered manifest, the MLflow
database and artifacts) and every MLflow param and tag.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer

from ckptflow.core.storage import Storage

FAKE = {
    "AWS_ACCESS_KEY_ID": "AKIAFAKESCAN7CKPTFLOW",
    "AWS_SECRET_ACCESS_KEY": "fakeSecretScan+ckptflow/7Qz9w3Lr0xYt2mB8",
    "AWS_SESSION_TOKEN": "FakeSessionTokenScanCkptflow0123456789abcdef",
    "MLFLOW_TRACKING_TOKEN": "fake-mlflow-token-scan-ckptflow-4242",
    "MLFLOW_TRACKING_PASSWORD": "fake-mlflow-password-scan-ckptflow",
}


@pytest.fixture
def fake_credentials(monkeypatch):
    for k, v in FAKE.items():
        monkeypatch.setenv(k, v)
    return FAKE


def leaks(blob: bytes | str) -> list[str]:
    """Names of the fake credentials found in `blob` (also base64- or URL-encoded forms)."""
    import base64
    from urllib.parse import quote

    data = blob.encode() if isinstance(blob, str) else blob
    found = []
    for name, value in FAKE.items():
        forms = {value, quote(value, safe=""), base64.b64encode(value.encode()).decode()}
        if any(f.encode() in data for f in forms):
            found.append(name)
    return found


def scan_tree(root: Path) -> dict[str, list[str]]:
    """file -> leaked credential names, for every file under root."""
    out = {}
    for p in root.rglob("*"):
        if p.is_file():
            hit = leaks(p.read_bytes())
            if hit:
                out[str(p)] = hit
    return out


@pytest.mark.s3
def test_checkpoint_files_and_logs_hold_no_credentials(
    s3_env, s3_bucket, fake_credentials, caplog, fault
):
    root = f"s3://{s3_bucket}/run/ckpt"
    with caplog.at_level(logging.DEBUG, logger="ckptflow"):
        ck = Checkpointer(root)
        ck.save(
            1,
            {"w": torch.randn(32, 32), "env": dict(os.environ).get("HOME", "")},
            metadata={"config": {"storage": root, "lr": 0.1}},
        )
        ck.load({"w": torch.zeros(32, 32), "env": None})
        ck.verify(1)
    st = Storage(root)
    files = {e.path: st.read(e.path) for e in st.walk()}
    assert any(p.startswith("step-") for p in files) and files
    assert {p: leaks(b) for p, b in files.items() if leaks(b)} == {}
    assert leaks(caplog.text) == []
    fault(
        "secrets",
        "fake credentials in the environment during an S3 save, load and verify",
        cases=len(files),
        detail="no credential in any stored file or log line",
    )


def test_rendered_argo_manifests_hold_no_credentials(fake_credentials, fault):
    from ckptflow.workflows.config import PipelineConfig
    from ckptflow.workflows.render import manifests

    names = ["pipeline", "pretrain", "finetune"]
    n = 0
    for name in names:
        for doc in manifests(name, PipelineConfig()):
            text = json.dumps(doc)
            n += 1
            assert leaks(text) == [], f"{name}: {leaks(text)}"
            if "AWS_SECRET_ACCESS_KEY" in text:  # credentials come from a Secret, by reference
                assert "secretKeyRef" in text
    fault(
        "secrets",
        "fake credentials in the environment while rendering every workflow",
        cases=n,
        detail="no credential in any rendered manifest",
    )


@pytest.mark.slow
def test_full_local_pipeline_run_leaks_no_credentials(
    tmp_path, fake_credentials, capsys, monkeypatch, fault
):
    from ckptflow.workflows.local import main
    from mlflow import MlflowClient

    monkeypatch.chdir(tmp_path)
    rc = main(["pipeline", "--local", "--runs-dir", str(tmp_path / "runs"), "--name", "scan"])
    out = capsys.readouterr()
    assert rc == 0, out.out[-3000:]
    assert leaks(out.out + out.err) == []
    files = [p for p in (tmp_path / "runs").rglob("*") if p.is_file()]
    kinds = {p.name for p in files}
    assert {"COMMIT", "eval.json", "workflow.yaml", "mlflow.db"} <= kinds, sorted(kinds)[:40]
    assert any(p.suffix == ".log" for p in files)
    assert scan_tree(tmp_path / "runs") == {}
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    exps = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(exps, max_results=1000)
    assert runs
    for r in runs:
        assert leaks(json.dumps(r.data.params)) == [], r.info.run_id
        assert leaks(json.dumps(r.data.tags)) == [], r.info.run_id
    models = client.search_logged_models(exps)
    for m in models:
        assert leaks(json.dumps(m.params) + json.dumps(m.tags)) == []
    fault(
        "secrets",
        "full `ckptflow run pipeline --local` with fake credentials in the environment",
        cases=len(files) + len(runs) + len(models),
        detail=f"{len(files)} files, {len(runs)} MLflow runs, {len(models)} logged models: clean",
    )

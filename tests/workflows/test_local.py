"""`ckptflow run pipeline --local`: the locally configured manifest is one the runner accepts,
and (slow) the whole pipeline runs through the local runner to a registered champion."""

from __future__ import annotations

import json
import sys

import pytest
from ckptflow.workflows.local import local_config, main
from ckptflow.workflows.render import manifests
from ckptflow.workflows.runner.cli import main as run_cli
from ckptflow.workflows.runner.manifest import validate


@pytest.mark.parametrize("s3", [None, "http://127.0.0.1:9"])
def test_local_manifest_is_runnable_by_the_local_runner(tmp_path, s3):
    cfg = local_config(tmp_path, s3_endpoint=s3, overrides=["pretrain.max_steps=12"])
    doc = manifests("pipeline", cfg)[0]
    validate(doc["spec"], env={})  # no Secret needed, no volume, nothing refused
    text = json.dumps(doc)
    assert "secretKeyRef" not in text and "/dev/shm" not in text
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


def test_run_builder_name_reaches_the_local_runner_hook(capsys):
    assert run_cli(["pipeline", "--set", "pretrain.rnks=2", "--local"]) == 2
    assert "did you mean pretrain.ranks" in capsys.readouterr().err


@pytest.mark.slow
def test_whole_pipeline_runs_locally(tmp_path, capsys):
    rc = main(["pipeline", "--local", "--runs-dir", str(tmp_path), "--name", "local-e2e"])
    out = capsys.readouterr().out
    print(out, file=sys.stderr)
    assert rc == 0, out
    assert "champion:" in out and "MLflow UI:" in out
    root = tmp_path / "local-e2e"
    assert (root / "pretrain" / "FINISHED").exists()
    commits = sorted(p.parent.name for p in (root / "pretrain" / "ckpt").glob("step-*/COMMIT"))
    assert commits == ["step-00000010", "step-00000020", "step-00000030", "step-00000040"]
    for step in commits:  # the concurrent evaluator did each one
        assert (root / "pretrain" / "ckpt" / step / "eval.json").exists()
    assert any((root / "export").rglob("*.safetensors"))

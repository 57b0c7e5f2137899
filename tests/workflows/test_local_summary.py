"""The end-of-run summary of `ckptflow run pipeline --local` (workflows.local_summary)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from ckptflow.workflows.local import local_config
from ckptflow.workflows.local_summary import champion_version, summary


def _select_node(version: str) -> SimpleNamespace:
    """A finished run whose select step registered `version` (its output parameters)."""
    params = {"chosen": "/r/finetune/a/ckpt/step-00000200", "model_version": version}
    node = {
        "displayName": "select",
        "type": "Pod",
        "outputs": {"parameters": [{"name": k, "value": v} for k, v in params.items()]},
    }
    return SimpleNamespace(nodes={"select-1": node})


def _registry(db, name: str, versions: int, champion: str) -> None:
    """An MLflow registry (sqlite) with `versions` versions of `name`, `champion` on one."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{db}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model(name)
    for _ in range(versions):
        client.create_model_version(name, source="file:///nowhere")
    client.set_registered_model_alias(name, "champion", champion)


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")
def test_summary_reports_the_champion_alias_as_it_stands(tmp_path):
    """Select registered v2 but kept `champion` on v1 (v1 scores better): the summary must
    not say the champion is v2 (issue 38, point 4)."""
    cfg = local_config(tmp_path, s3_endpoint=None, overrides=[])
    name = cfg.finetune.select.model_name
    db = tmp_path / "mlflow.db"
    _registry(db, name, versions=2, champion="1")
    assert champion_version(db, name) == "1"
    text = summary(cfg, "run1", _select_node("2"), tmp_path, {}, mlflow_db=db)
    line = next(s for s in text.splitlines() if "champion:" in s)
    assert f"registered as {name} version 2" in line, line
    assert f"{name}@champion is version 1" in line, line
    assert "-> MLflow model" not in text


def test_summary_says_when_the_new_version_is_the_champion(tmp_path):
    cfg = local_config(tmp_path, s3_endpoint=None, overrides=[])
    name = cfg.finetune.select.model_name
    db = tmp_path / "mlflow.db"
    _registry(db, name, versions=1, champion="1")
    text = summary(cfg, "run1", _select_node("1"), tmp_path, {}, mlflow_db=db)
    assert f"registered as {name} version 1, now {name}@champion" in text, text


def test_summary_without_a_registry_does_not_claim_an_alias(tmp_path):
    cfg = local_config(tmp_path, s3_endpoint=None, overrides=[])
    name = cfg.finetune.select.model_name
    assert champion_version(tmp_path / "none.db", name) is None
    text = summary(cfg, "run1", _select_node("3"), tmp_path, {}, mlflow_db=tmp_path / "none.db")
    line = next(s for s in text.splitlines() if "champion:" in s)
    assert f"registered as {name} version 3" in line and "@champion" not in line, line


def test_summary_says_how_to_score_the_registered_champion(tmp_path):
    """The registered version loads through MLflow (a pyfunc): the summary names the command
    that scores it on the fine-tune task (issue 38 point 3)."""
    cfg = local_config(tmp_path, s3_endpoint=None, overrides=[])
    name = cfg.finetune.select.model_name
    db = tmp_path / "mlflow.db"
    _registry(db, name, versions=1, champion="1")
    text = summary(cfg, "run1", _select_node("1"), tmp_path, {}, mlflow_db=db)
    line = next(s for s in text.splitlines() if "score it:" in s)
    want = f"evaluate models:/{name}@champion --tracking-uri sqlite:///{db.resolve()} --task "
    assert want + cfg.finetune.train.task in line, line
    s3 = local_config(tmp_path, s3_endpoint="http://127.0.0.1:9", overrides=[])
    text = summary(s3, "run1", SimpleNamespace(nodes={}), tmp_path, {}, mlflow_db=db)
    assert "the registered model is a copy in MLflow's store and stays loadable" in text

"""Model registry: versions with lineage tags; `champion` / `fallback` move only on evidence."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from ckptflow.steps.lib import registry
from ckptflow.steps.lib.lineage import Lineage

from tests.steps.test_finetune import mlflow_template  # noqa: F401


@pytest.fixture
def no_tracking_uri(monkeypatch):
    """MLFLOW_TRACKING_URI unset for the test, and put back as it was after it, whatever the
    test (or the code under test) left there."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")  # recorded, so teardown restores it
    monkeypatch.delenv("MLFLOW_TRACKING_URI")


@pytest.fixture
def client(tmp_path, mlflow_template):  # noqa: F811
    shutil.copy(mlflow_template, tmp_path / "mlflow.db")
    return registry.client_for(f"sqlite:///{tmp_path}/mlflow.db")


def _reg(client, value, *, metric="exact_match", mode="max", force=False, name="m"):
    return registry.register(
        client,
        name,
        source=f"/export/{value}",
        run_id=None,
        metric=metric,
        value=value,
        mode=mode,
        tags={"ckptflow.source_step": 8},
        force=force,
    )


def aliases(client, name="m") -> dict:
    return {a: str(v) for a, v in client.get_registered_model(name).aliases.items()}


def test_aliases_follow_the_metric_in_its_direction(client):
    d = _reg(client, 0.5)
    assert (d.version, d.promoted, d.previous_champion) == ("1", True, None)
    assert aliases(client) == {"champion": "1"}
    d = _reg(client, 0.4)  # worse for max
    assert not d.promoted and "does not beat champion v1" in d.reason and "--force" in d.reason
    assert aliases(client) == {"champion": "1"}
    d = _reg(client, 0.7)
    assert d.promoted and d.previous_value == 0.5 and (d.champion, d.fallback) == ("3", "1")
    assert aliases(client) == {"champion": "3", "fallback": "1"}
    assert not _reg(client, 0.7).promoted  # a tie does not displace the champion
    d = _reg(client, 0.1, force=True)
    assert d.promoted and aliases(client) == {"champion": "5", "fallback": "3"}
    tags = client.get_model_version("m", "2").tags
    assert tags["ckptflow.promoted"] == "false" and tags["ckptflow.metric"] == "exact_match"
    assert float(tags["ckptflow.metric_value"]) == 0.4 and tags["ckptflow.source_step"] == "8"
    assert client.get_model_version("m", "5").source == "/export/0.1"


def test_min_mode_and_an_incomparable_champion(client):
    _reg(client, 2.0, metric="val_loss", mode="min", name="n")
    assert _reg(client, 1.5, metric="val_loss", mode="min", name="n").promoted
    assert not _reg(client, 1.6, metric="val_loss", mode="min", name="n").promoted
    assert aliases(client, "n") == {"champion": "2", "fallback": "1"}
    # the champion was chosen by another metric: not comparable, so it stays unless forced
    d = _reg(client, 0.9, metric="exact_match", mode="max", name="n")
    assert not d.promoted and "not comparable" in d.reason
    assert _reg(client, 0.9, metric="exact_match", mode="max", name="n", force=True).promoted
    assert aliases(client, "n") == {"champion": "5", "fallback": "2"}


def test_a_version_from_a_logged_model_is_listed_on_it(client):
    exp = client.create_experiment("reg")
    run = client.create_run(exp)
    model = client.create_logged_model(exp, name="ckpt-step-8", source_run_id=run.info.run_id)
    for i in (1, 2):
        d = registry.register(
            client,
            "lm",
            source="/export/unused",
            run_id=run.info.run_id,
            metric="val_loss",
            value=1.0 / i,
            mode="min",
            tags={},
            model_id=model.model_id,
        )
        assert d.version == str(i)
    mv = client.get_model_version("lm", "2")
    assert mv.source == f"models:/{model.model_id}" and mv.run_id == run.info.run_id
    listed = client.get_logged_model(model.model_id).tags["mlflow.modelVersions"]
    assert json.loads(listed) == [{"name": "lm", "version": "1"}, {"name": "lm", "version": "2"}]


def test_registering_leaves_mlflows_process_wide_store_as_it_was(no_tracking_uri, client, tmp_path):
    """MLflow's registry looks a LoggedModel up through the process-wide tracking URI, and
    mlflow.set_tracking_uri also writes MLFLOW_TRACKING_URI into os.environ: left there, every
    later MLflow run of the process, and of every process it starts, went to this registry's
    store, not to its own run root's (a resumed pretrain's tags were missing from its mlflow.db)."""
    exp = client.create_experiment("reg")
    run = client.create_run(exp).info.run_id
    model = client.create_logged_model(exp, name="ckpt-step-8", source_run_id=run)
    d = registry.register(
        client, "lm", source="", run_id=run, metric="x", value=1.0, mode="max", tags={},
        model_id=model.model_id,
    )  # fmt: skip
    assert d.version == "1" and client.get_model_version("lm", "1").run_id == run
    assert "MLFLOW_TRACKING_URI" not in os.environ
    assert "MLFLOW_REGISTRY_URI" not in os.environ
    root = str(tmp_path / "later-step")
    assert Lineage.for_run_root(root).tracking_uri == f"sqlite:///{root}/mlflow.db"

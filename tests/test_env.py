"""`ckptflow.env`: the one reader of deployment wiring, and the storage options it gives."""

from __future__ import annotations

import os

from ckptflow import env
from ckptflow.core.storage import StorageOptions

S3_VARS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_REGION")
STORE_VARS = (*S3_VARS, "STORAGE_EMULATOR_HOST")


def test_storage_options_from_the_environment(monkeypatch):
    for var in STORE_VARS:
        monkeypatch.delenv(var, raising=False)
    assert env.storage_options() == StorageOptions()
    assert env.s3_storage_options() == {"use_listings_cache": False}
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://generic:9000")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert env.storage_options() == StorageOptions("http://generic:9000", "eu-west-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://s3-only:9000")  # the S3-specific one wins
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    assert env.storage_options() == StorageOptions("http://s3-only:9000", "us-east-1")
    assert env.s3_storage_options() == {
        "use_listings_cache": False,
        "client_kwargs": {"endpoint_url": "http://s3-only:9000", "region_name": "us-east-1"},
    }


def test_open_storage_passes_the_options(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://s3-only:9000")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    st = env.open_storage("memory://env-open/run")
    assert st.options == StorageOptions("http://s3-only:9000", "us-east-1")


def test_a_gcs_emulator_from_the_standard_variable(monkeypatch):
    for var in STORE_VARS:
        monkeypatch.delenv(var, raising=False)
    assert env.storage_options().gcs_endpoint is None
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "default")  # Google's word for "none"
    assert env.storage_options().gcs_endpoint is None
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "localhost:9023")  # scheme-less, as Google's
    assert env.storage_options() == StorageOptions(gcs_endpoint="http://localhost:9023")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "https://gcs.example:443")
    assert env.storage_options().gcs_endpoint == "https://gcs.example:443"


def test_azure_secrets_are_scrubbed(monkeypatch):
    for var in env.SECRET_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "AccountKey=c2VjcmV0;")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", "a2V5")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "not-a-secret")
    assert sorted(env.secret_values()) == ["AccountKey=c2VjcmV0;", "a2V5"]


def test_node_name_from_the_downward_api_else_the_hostname(monkeypatch):
    import socket

    for var in env.NODE_NAME_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    assert env.node_name() == socket.gethostname()
    monkeypatch.setenv("CKPTFLOW_NODE_NAME", "node-b")
    assert env.node_name() == "node-b"
    monkeypatch.setenv("NODE_NAME", "node-a")  # spec.nodeName as the tier's template sets it
    assert env.node_name() == "node-a"
    monkeypatch.setenv("NODE_NAME", "  ")  # blank: not a name
    assert env.node_name() == "node-b"


def test_mlflows_default_store_is_set_for_the_block_only(monkeypatch, tmp_path):
    """Inside: MLflow's process-wide store (and the variables MLflow writes for it); after: the
    variables as they were, set or unset, and MLflow's own setting back to them."""
    import mlflow

    db = f"sqlite:///{tmp_path}/mlflow.db"
    for before in (None, "http://mlflow.deployment:5000"):
        for var in env.MLFLOW_URI_VARIABLES:
            monkeypatch.setenv(var, "")  # recorded, so teardown restores it
            monkeypatch.delenv(var)
            if before is not None:
                monkeypatch.setenv(var, before)
        with env.mlflow_default_store(db):
            assert mlflow.get_tracking_uri() == mlflow.get_registry_uri() == db
            assert env.mlflow_tracking_uri() == db
        assert [os.environ.get(v) for v in env.MLFLOW_URI_VARIABLES] == [before, before]
        assert env.mlflow_tracking_uri() == before and mlflow.get_tracking_uri() != db
        assert mlflow.get_registry_uri() != db

"""GCS and Azure credentials reach every step by Secret reference only: the Azure connection
string (or account key) as env valueFrom secretKeyRef, the GCS service-account key as a mounted
Secret named by GOOGLE_APPLICATION_CREDENTIALS. No credential value is ever in a manifest; with
the defaults (no such Secret) nothing changes (the golden files stay as they were)."""

from __future__ import annotations

import pytest
from ckptflow.workflows.config import PipelineConfig, apply_overrides
from ckptflow.workflows.render import manifests

from tests.workflows.argo_schema import errors

CLOUDS = (
    "platform.storage_root=gs://bucket/runs",
    "platform.gcs_secret=ckptflow-gcs",
    "platform.azure_secret=ckptflow-azure",
)


def _containers(docs: list[dict]):
    for doc in docs:
        spec = doc["spec"].get("workflowSpec", doc["spec"])
        for t in spec["templates"]:
            if "container" in t:
                yield t, t["container"]


def _env(container: dict) -> dict:
    return {e["name"]: e for e in container.get("env", [])}


def test_gcs_and_azure_secrets_are_wired_by_reference():
    docs = manifests("pipeline", apply_overrides(PipelineConfig(), CLOUDS))
    for doc in docs:
        assert errors(doc) == [], errors(doc)  # Argo's schema, strict
    seen = 0
    for template, container in _containers(docs):
        env = _env(container)
        if "AWS_ACCESS_KEY_ID" not in env:
            continue  # a helper without credentials (least privilege): none of these either
        seen += 1
        azure = env["AZURE_STORAGE_CONNECTION_STRING"]
        assert azure == {
            "name": "AZURE_STORAGE_CONNECTION_STRING",
            "valueFrom": {
                "secretKeyRef": {"name": "ckptflow-azure", "key": "AZURE_STORAGE_CONNECTION_STRING"}
            },
        }
        key_path = env["GOOGLE_APPLICATION_CREDENTIALS"]["value"]
        mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
        assert mounts["gcs-key"]["readOnly"] is True
        assert key_path.startswith(mounts["gcs-key"]["mountPath"] + "/")
        volumes = {v["name"]: v for v in template.get("volumes", [])}
        assert volumes["gcs-key"]["secret"]["secretName"] == "ckptflow-gcs"
    assert seen >= 3


def test_an_azure_account_key_comes_with_its_account_name():
    cfg = apply_overrides(
        PipelineConfig(),
        (
            "platform.azure_secret=az",
            "platform.azure_secret_key=key",
            "platform.azure_account_name=acct",
        ),
    )
    docs = manifests("pretrain", cfg)
    envs = [_env(c) for _, c in _containers(docs) if "AWS_ACCESS_KEY_ID" in _env(c)]
    assert envs
    env = envs[0]
    assert env["AZURE_STORAGE_ACCOUNT_NAME"]["value"] == "acct"
    assert env["AZURE_STORAGE_ACCOUNT_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "az",
        "key": "key",
    }
    assert "AZURE_STORAGE_CONNECTION_STRING" not in env


@pytest.mark.parametrize("name", ("pipeline", "pretrain"))
def test_defaults_wire_no_gcs_or_azure(name):
    """Only the embedded config names the (empty) settings; no pod gets such env or volume."""
    docs = manifests(name, PipelineConfig())
    for template, container in _containers(docs):
        assert not [n for n in _env(container) if n.startswith(("GOOGLE_", "AZURE_"))]
        assert "gcs-key" not in {v["name"] for v in template.get("volumes", [])}


def test_an_azure_account_without_a_secret_is_for_workload_identity():
    """AKS workload identity: no Secret, only the account; adlfs then authenticates with
    DefaultAzureCredential, which needs AZURE_STORAGE_ACCOUNT_NAME (it was rendered only
    beside an account-key Secret: docs/cluster.md)."""
    cfg = apply_overrides(PipelineConfig(), ("platform.azure_account_name=acct",))
    envs = [_env(c) for _, c in _containers(manifests("pretrain", cfg))]
    steps = [e for e in envs if "MLFLOW_TRACKING_URI" in e]
    assert steps and all(e["AZURE_STORAGE_ACCOUNT_NAME"]["value"] == "acct" for e in steps)
    assert not [n for e in envs for n in e if n.startswith("AZURE_") and "valueFrom" in e[n]]

"""Fixtures for the cluster tests: the k3d cluster made by `make cluster`, reached from the host.

Settings (environment): CKPTFLOW_E2E_CONTEXT (kubectl context, default k3d-ckptflow),
CKPTFLOW_E2E_ARGO (Argo Server, default http://localhost:2746), CKPTFLOW_E2E_MLFLOW
(default http://localhost:5050), CKPTFLOW_E2E_S3 (MinIO, default http://localhost:9090) and
CKPTFLOW_E2E_IMAGE (the imported step image; default platform.image). With
CKPTFLOW_E2E_REQUIRE=1 (`make e2e`, CI) a missing tool or cluster fails instead of skipping.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import urllib.request

import pytest

CONTEXT = os.environ.get("CKPTFLOW_E2E_CONTEXT", "k3d-ckptflow")
ARGO = os.environ.get("CKPTFLOW_E2E_ARGO", "http://localhost:2746")
MLFLOW = os.environ.get("CKPTFLOW_E2E_MLFLOW", "http://localhost:5050")
S3 = os.environ.get("CKPTFLOW_E2E_S3", "http://localhost:9090")
NAMESPACE = "ckptflow"
REQUIRED = os.environ.get("CKPTFLOW_E2E_REQUIRE", "") not in ("", "0", "false")


def pytest_collection_modifyitems(config, items):
    """Under CKPTFLOW_E2E_REQUIRE a skipped cluster test is an error, not a silent pass."""
    if REQUIRED:
        missing = [t for t in ("docker", "k3d", "kubectl") if not shutil.which(t)]
        if missing and any("cluster" in item.keywords for item in items):
            raise pytest.UsageError(f"CKPTFLOW_E2E_REQUIRE is set but {missing} not on PATH")


def kubectl(
    *args: str, namespace: str = NAMESPACE, check: bool = True, timeout: float = 120
) -> str:
    done = subprocess.run(
        ["kubectl", "--context", CONTEXT, "-n", namespace, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def kubectl_json(*args: str) -> dict:
    return json.loads(kubectl(*args, "-o", "json"))


def _reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def cluster() -> None:
    """The cluster is up: kubectl reaches it and the Argo Server and MLflow answer."""
    problems = []
    try:
        kubectl("get", "deployment", "mlflow")
    except (AssertionError, subprocess.TimeoutExpired) as exc:
        problems.append(str(exc))
    for url in (f"{ARGO}/api/v1/version", f"{MLFLOW}/health"):
        if not _reachable(url):
            problems.append(f"{url} does not answer")
    if problems:
        message = "no ckptflow cluster (run `make cluster`): " + "; ".join(problems)
        if REQUIRED:
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def s3_from_host(cluster) -> dict:
    """Environment for reaching the cluster's MinIO from the host with the cluster's keys."""
    secret = kubectl_json("get", "secret", "ckptflow-s3")["data"]
    keys = {k: base64.b64decode(secret[k]).decode() for k in secret}
    return {
        "AWS_ENDPOINT_URL": S3,
        "AWS_ACCESS_KEY_ID": keys["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": keys["AWS_SECRET_ACCESS_KEY"],
        "AWS_DEFAULT_REGION": keys.get("AWS_DEFAULT_REGION", "us-east-1"),
    }


@pytest.fixture
def host_s3_env(s3_from_host, monkeypatch):
    """Point this process's storage (ckptflow.env reads the AWS variables) at MinIO."""
    for key, value in s3_from_host.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return s3_from_host

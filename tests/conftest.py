"""Shared fixtures: an in-process S3 server (moto), S3 buckets, and marker skips."""

from __future__ import annotations

import os
import shutil
import socket
import uuid

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_server():
    """A real S3 HTTP API in this process (moto's ThreadedMotoServer); yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3_env(moto_server, monkeypatch):
    """Point the standard AWS environment at the in-process server (fake credentials)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing-key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret-key")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return moto_server


@pytest.fixture
def s3_bucket(s3_env):
    """A fresh bucket on the in-process server; yields its name."""
    import boto3

    name = f"test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_env).create_bucket(Bucket=name)
    return name


def pytest_collection_modifyitems(config, items):
    """Skip minio/cluster tests with a clear reason when their infrastructure is absent."""
    minio_up = bool(os.environ.get("CKPTFLOW_MINIO_ENDPOINT"))
    cluster_tools = all(shutil.which(t) for t in ("docker", "k3d", "kubectl"))
    for item in items:
        if "minio" in item.keywords and not minio_up:
            item.add_marker(
                pytest.mark.skip(
                    reason="needs MinIO: `docker compose -f minio-compose.yaml up -d` and "
                    "CKPTFLOW_MINIO_ENDPOINT=http://127.0.0.1:9000"
                )
            )
        if "cluster" in item.keywords and not cluster_tools:
            item.add_marker(
                pytest.mark.skip(
                    reason="needs docker, k3d and kubectl on PATH (see README 'Run it on a cluster')"
                )
            )

"""The one place that reads deployment wiring from the environment.

Only deployment settings live here: the S3 endpoint and credentials (the standard AWS
variables, which botocore also understands) and the MLflow tracking URI. Nothing read here
is ever written into a manifest, a log line or MLflow.
"""

from __future__ import annotations

import os

# Variables whose values are secrets: code that records configuration must drop them.
SECRET_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def s3_endpoint_url() -> str | None:
    """The S3 endpoint (MinIO, moto, ...) or None for AWS itself."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def s3_storage_options() -> dict:
    """fsspec/s3fs options for the S3 endpoint; credentials come from botocore's own chain."""
    opts: dict = {}
    endpoint = s3_endpoint_url()
    if endpoint:
        opts["client_kwargs"] = {"endpoint_url": endpoint}
    region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION")
    if region:
        opts.setdefault("client_kwargs", {})["region_name"] = region
    return opts


def mlflow_tracking_uri(default: str | None = None) -> str | None:
    """MLFLOW_TRACKING_URI when set, else the caller's embedded default."""
    return os.environ.get("MLFLOW_TRACKING_URI") or default


def secret_values() -> list[str]:
    """The values of secret variables currently set (for scrubbing and for tests)."""
    return [v for k in SECRET_VARIABLES if (v := os.environ.get(k))]

"""The one place that reads deployment wiring from the environment.

Only deployment settings live here: the S3 endpoint and credentials (the standard AWS
variables, which botocore also understands), a GCS emulator's endpoint (STORAGE_EMULATOR_HOST,
as Google's own clients read it), the names of the Azure secrets to scrub (adlfs reads the
AZURE_STORAGE_* variables itself; GOOGLE_APPLICATION_CREDENTIALS names a key file that
google-auth reads) and the MLflow tracking URI. The storage module
reads none of it: entry points pass `storage_options()` (or use `open_storage`). Nothing read here
is ever written into a manifest, a log line or MLflow.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

# Variables whose values are secrets: code that records configuration must drop them.
SECRET_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_CLIENT_SECRET",
    "ARGO_TOKEN",
)


def s3_endpoint_url() -> str | None:
    """The S3 endpoint (MinIO, moto, ...) or None for AWS itself."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def s3_region() -> str | None:
    """The S3 region, or None for botocore's default."""
    return os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or None


def gcs_emulator_endpoint() -> str | None:
    """STORAGE_EMULATOR_HOST (a GCS emulator, reached without credentials) as a URL, or None
    for Google Cloud itself."""
    host = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
    if host in ("", "default"):
        return None
    return host if host.startswith(("http://", "https://")) else f"http://{host}"


def storage_options():
    """The `StorageOptions` of this deployment (S3 endpoint and region, a GCS emulator);
    credentials stay in each cloud library's own chain. What every entry point gives the
    storage it opens."""
    # imported here: this module needs nothing but os, so any layer can read its wiring
    from ckptflow.core.storage import StorageOptions

    return StorageOptions(
        endpoint_url=s3_endpoint_url(), region=s3_region(), gcs_endpoint=gcs_emulator_endpoint()
    )


def open_storage(uri: str):
    """A `Storage` for `uri`, reached the way this deployment is wired (`storage_options`)."""
    from ckptflow.core.storage import Storage

    return Storage(uri, options=storage_options())


def s3_storage_options() -> dict:
    """fsspec/s3fs options for the S3 endpoint; credentials come from botocore's own chain."""
    return storage_options().s3_kwargs()


def debug() -> bool:
    """CKPTFLOW_DEBUG=1: an unexpected error in a command shows its traceback (else one line)."""
    return os.environ.get("CKPTFLOW_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


def mlflow_tracking_uri(default: str | None = None) -> str | None:
    """MLFLOW_TRACKING_URI when set, else the caller's embedded default."""
    return os.environ.get("MLFLOW_TRACKING_URI") or default


MLFLOW_URI_VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")


@contextlib.contextmanager
def mlflow_default_store(uri: str) -> Iterator[None]:
    """MLflow's process-wide tracking and registry URIs set to `uri` for the block only.

    Some MLflow calls take the process-wide store whatever client they go through (its SQL
    registry looks a `models:/<model_id>` source up with a default client; pyfunc.load_model
    of a models:/ URI). mlflow.set_tracking_uri and set_registry_uri also write
    MLFLOW_TRACKING_URI and MLFLOW_REGISTRY_URI into os.environ; left there, every later
    MLflow run of this process, and of every process it starts, goes to `uri` instead of its
    own run root's store (a pretrain's resume tags went to another step's database). After
    the block both variables, and MLflow's own setting, are as they were."""
    import mlflow

    before = {k: os.environ.get(k) for k in MLFLOW_URI_VARIABLES}
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(before["MLFLOW_TRACKING_URI"])  # None: unset
        mlflow.set_registry_uri(before["MLFLOW_REGISTRY_URI"])  # (it leaves the variable set)
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def secret_values() -> list[str]:
    """The values of secret variables currently set (for scrubbing and for tests)."""
    return [v for k in SECRET_VARIABLES if (v := os.environ.get(k))]


# -- added for pretrain/evaluate/lineage (issue 6) -----------------------------------------------
# Argo sets these in every step container: the workflow engineer passes them through env vars.
ARGO_VARIABLES = {
    "workflow_name": "ARGO_WORKFLOW_NAME",
    "workflow_uid": "ARGO_WORKFLOW_UID",
    "namespace": "ARGO_WORKFLOW_NAMESPACE",
    "image": "CKPTFLOW_IMAGE",
    "git_commit": "CKPTFLOW_GIT_COMMIT",
}


ARGO_UI = "CKPTFLOW_ARGO_UI"  # the Argo Server's URL (platform.argo_ui), for links to the workflow


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def argo_client() -> dict:
    """The Argo CLI's own variables, for `ckptflow submit` (they configure the client, never a
    step): `server` (ARGO_SERVER, host:port or a URL; None when unset), `secure` (ARGO_SECURE,
    https unless "false"), `token` (ARGO_TOKEN; None when unset) and `skip_verify`
    (ARGO_INSECURE_SKIP_VERIFY=true: no TLS check)."""
    return {
        "server": os.environ.get("ARGO_SERVER") or None,
        "secure": os.environ.get("ARGO_SECURE", "true").strip().lower() != "false",
        "token": os.environ.get("ARGO_TOKEN") or None,
        "skip_verify": _truthy(os.environ.get("ARGO_INSECURE_SKIP_VERIFY")),
    }


def argo_workflow_url() -> str | None:
    """The Argo UI page of this step's workflow, or None when the UI or the names are unset."""
    info, ui = argo_workflow_info(), os.environ.get(ARGO_UI, "").rstrip("/")
    if not (ui and info.get("workflow_name") and info.get("namespace")):
        return None
    return f"{ui}/workflows/{info['namespace']}/{info['workflow_name']}"


def argo_workflow_info() -> dict[str, str]:
    """Workflow name, uid, namespace, image and git commit that are set (others left out)."""
    found = {k: v for k, var in ARGO_VARIABLES.items() if (v := os.environ.get(var))}
    if "namespace" not in found and os.environ.get("ARGO_NAMESPACE"):
        found["namespace"] = os.environ["ARGO_NAMESPACE"]
    return found


def torchrun_rank_info() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) when launched by torchrun, else None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return rank, world, int(os.environ.get("LOCAL_RANK", rank))


def prepare_deterministic_cuda() -> None:
    """cuBLAS needs this set before its first use to run deterministically (harmless on CPU)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def limit_mlflow_http_retries(max_retries: int = 0, timeout_s: int = 10) -> None:
    """Bound MLflow's own HTTP retries (default: 7 retries, 120 s timeout) unless the user set
    them, so an unreachable tracking server costs seconds, not minutes, per call (the caller,
    ckptflow.steps.lib.lineage, retries on its own terms)."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(max_retries))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(timeout_s))


# -- added for preflight and stragglers (issue 18) -----------------------------------------------
# The rank templates set these from the downward API (metadata.name, spec.nodeName).
POD_NAME_VARIABLE = "CKPTFLOW_POD_NAME"
NODE_NAME_VARIABLE = "CKPTFLOW_NODE_NAME"


def pod_identity() -> tuple[str, str]:
    """(pod name, node name) of this process, to name a slow rank: the downward API's when
    the template sets them, else the hostname and "" (a plain local process)."""
    import socket

    pod = os.environ.get(POD_NAME_VARIABLE) or socket.gethostname()
    node = (os.environ.get(v, "").strip() for v in NODE_NAME_VARIABLES)
    return pod, next((n for n in node if n), "")


# The node a rank pod runs on, for the local tier's replica placement (issue 35): the rank
# template's downward API spec.nodeName as NODE_NAME (or the older CKPTFLOW_NODE_NAME).
NODE_NAME_VARIABLES = ("NODE_NAME", NODE_NAME_VARIABLE)


def node_name() -> str:
    """The name of the node this process runs on: NODE_NAME (the downward API's spec.nodeName),
    else CKPTFLOW_NODE_NAME, else the hostname (a plain local process: one node)."""
    import socket

    for var in NODE_NAME_VARIABLES:
        if value := os.environ.get(var, "").strip():
            return value
    return socket.gethostname()


# A rank pod's own IP (the downward API's status.podIP, workflows/templates.py rank_env); the
# name is torchrun's, which publishes it as the agent's address (--local-addr).
POD_IP_VARIABLE = "PET_LOCAL_ADDR"


def pod_ip() -> str | None:
    """This pod's IP when the template gives it (rank 0 publishes it as the rendezvous)."""
    return os.environ.get(POD_IP_VARIABLE) or None


def torchelastic_agent_pid() -> int | None:
    """The pid of the torchrun agent that started this worker, None outside torchrun."""
    return os.getppid() if os.environ.get("TORCHELASTIC_RUN_ID") else None

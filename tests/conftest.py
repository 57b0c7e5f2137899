"""Shared fixtures: an in-process S3 server (moto), S3 buckets, and marker skips."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import uuid

import pytest

# A suite started in the background (`cmd &` in a non-interactive shell, as a CI agent may run
# it) inherits SIGINT and SIGQUIT ignored, and an ignored signal stays ignored across exec: the
# runners that the Ctrl-C tests start never saw their SIGINT and timed out (3 of them, CI run at
# cd7a7ba). This process's processes stand for a terminal's foreground job: a handler (reset to
# the default by exec) instead of SIG_IGN.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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


# How `make test` (pytest-xdist) shares the suite between its workers: a group's tests run on
# one worker, in order; groups that take minutes are handed out first (a long group started
# last runs alone at the end: test_node_loss, 11 minutes, came last in collection order).
# Measured with --durations at 6f9c62e. (xdist's own `xdist_group` marks do nothing under
# pytest 9.2: xdist 3.8 renames `item._nodeid`, which pytest no longer reads, so every
# module's tests were spread over both workers and each worker built the module fixtures
# again: the fine-tune runs twice, 154 s each, the pretrain pipeline four times.)
#
# Modules that run workflows as pods (namespaces, a bridge, cgroups, torch in every rank pod)
# run one at a time, so no two workflows of rank pods compete for 2 cores while the tests
# assert their deadlines (the runner itself takes concurrent nodes: a subnet each, names by pid).
POD_MODULES = {
    "test_isolation",
    "test_isolation_gang_node_loss",
    "test_isolation_pretrain",
    "test_isolation_spec",
    "test_node_loss",
    "test_pods_cleanup",
    "test_pods_node",
    "test_pods_podspec",
    "test_preempt_pods",
    "test_runner_argo_examples",
    "test_runner_examples_misc",
    "test_runner_pod_containers",
}
# Modules that share a session-cached fixture: together, it is built once.
SHARED = {
    "test_finetune": "finetuned",  # the `finetuned` runs (tests/steps/test_finetune.py)
    "test_select": "finetuned",
    "test_mlflow_lineage": "finetuned",
    "test_pretrain": "pipeline",  # `pipeline_run` (tests/steps/test_pretrain.py)
    "test_evaluate": "pipeline",
}
LONG_FIRST = ("pods", "finetuned", "pipeline")


def group_of(nodeid: str) -> str:
    """The group a test runs in: its module's, or the group its module shares."""
    path = nodeid.split("::", 1)[0]
    module = path.rsplit("/", 1)[-1].removesuffix(".py")
    if module in POD_MODULES:
        return "pods"
    return SHARED.get(module, path)


def _long_first(nodeid: str) -> int:
    group = group_of(nodeid)
    return LONG_FIRST.index(group) if group in LONG_FIRST else len(LONG_FIRST)


@pytest.hookimpl(optionalhook=True)  # a run without xdist (`-p no:xdist`) has no such hook
def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduling, by group_of() in the order of the collection (which
    pytest_collection_modifyitems puts the long groups first in)."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    config.option.loadscopereorder = False  # its order is by test count, not duration
    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """Skip minio/cluster tests with a clear reason when their infrastructure is absent; put
    the long groups first (a stable sort: the rest keep their order)."""
    items.sort(key=lambda item: _long_first(item.nodeid))
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


# -- Google Cloud Storage and Azure Blob emulators ------------------------------------------------
# gcp-storage-emulator (PyPI) runs in this process; azurite (npm, installed by `make test` into
# .venv/azurite) runs as a child process. Both listen on 127.0.0.1 only, behind a CloudProxy
# (tests/cloud_proxy.py) that injects transient failures on demand. On CI (CI=true) a missing
# emulator fails the test instead of skipping it: the set-up must have installed it.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AZURITE = os.path.join(REPO, ".venv", "azurite", "node_modules", ".bin", "azurite-blob")
# Azurite's fixed, published development account (no secret: every azurite has it).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def _missing(what: str):
    """Fail on CI (the set-up must provide it), skip with the fix elsewhere."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{what} is missing on CI: `make test` installs it")
    pytest.skip(f"{what} is missing: run `make test` (or the Makefile's set-up) to install it")


def _wait_port(port: int, proc=None, timeout_s: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"emulator exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"emulator did not listen on port {port} within {timeout_s} s")


@pytest.fixture(scope="session")
def gcs_emulator():
    """gcp-storage-emulator in this process; yields its URL. It ignores ifGenerationMatch."""
    try:
        from gcp_storage_emulator.server import create_server
    except ImportError:
        _missing("gcp-storage-emulator (PyPI)")
    _binary_safe_uploads()
    port = _free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    _wait_port(port)
    yield f"http://127.0.0.1:{port}"
    server.stop()


def _binary_safe_uploads() -> None:
    """gcp-storage-emulator parses a multipart upload with the email package, which takes a
    `\r` that ends the content for part of the line break before the closing boundary and
    drops it (one object in 256 ends in one: CI's GCS round trip failed when a pack did; real
    GCS keeps it). Split gcsfs's `multipart/related` body at its boundary instead, exactly."""
    from gcp_storage_emulator import server as srv

    if getattr(srv._read_data, "binary_safe", False):
        return
    original = srv._read_data

    def read_data(handler, query):
        ctype = handler.headers.get("Content-Type") or ""
        if not ctype.startswith("multipart/related"):
            return original(handler, query)
        raw = srv._decode_raw_data(srv._read_raw_data(handler), handler)
        boundary = b"--" + ctype.split("boundary=", 1)[1].strip().strip('"').encode()
        meta, (content_type, content) = [_mime_part(p) for p in raw.split(boundary)[1:3]]
        return {"meta": json.loads(meta[1]), "content": content, "content-type": content_type}

    read_data.binary_safe = True
    srv._read_data = read_data


def _mime_part(piece: bytes) -> tuple[str, bytes]:
    """(its Content-Type, its bytes) of one part between two boundaries, line breaks LF or
    CRLF as the part's first one is."""
    nl = b"\r\n" if piece.startswith(b"\r\n") else b"\n"
    head, _, body = piece[len(nl) :].partition(nl + nl)
    body = body[: -len(nl)] if body.endswith(nl) else body
    ctype = "application/octet-stream"
    for line in head.split(nl):
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-type":
            ctype = value.strip().split(";")[0]
    return ctype, body


@pytest.fixture(scope="session")
def gcs_proxy(gcs_emulator):
    """The emulator behind a proxy that enforces ifGenerationMatch=0 (as GCS does) and injects
    faults on demand."""
    from tests.cloud_proxy import CloudProxy

    proxy = CloudProxy(gcs_emulator, gcs_preconditions=True).start()
    yield proxy
    proxy.stop()


@pytest.fixture
def gcs_env(gcs_proxy, monkeypatch):
    """Point the standard GCS emulator variable at the proxy; yields the proxy."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_proxy.url)
    gcs_proxy.fail()
    return gcs_proxy


@pytest.fixture
def gcs_bucket(gcs_env):
    """A fresh bucket on the GCS emulator; yields its name."""
    from gcsfs.core import GCSFileSystem

    name = f"test-{uuid.uuid4().hex[:12]}"
    GCSFileSystem(endpoint_url=gcs_env.url, token="anon", project="test").mkdir(name)
    return name


@pytest.fixture(scope="session")
def azurite():
    """Azurite's blob service as a child process, in memory; yields its URL."""
    import subprocess

    exe = AZURITE if os.path.exists(AZURITE) else shutil.which("azurite-blob")
    if not exe:
        _missing("azurite (npm)")
    port = _free_port()
    proc = subprocess.Popen(
        [exe, "--silent", "--inMemoryPersistence", "--blobHost", "127.0.0.1"]
        + ["--blobPort", str(port), "--skipApiVersionCheck", "--loose"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_port(port, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()  # in memory, nothing to keep (a SIGTERM waits for idle connections)
        proc.wait(timeout=30)


@pytest.fixture(scope="session")
def az_proxy(azurite):
    from tests.cloud_proxy import CloudProxy

    proxy = CloudProxy(azurite).start()
    yield proxy
    proxy.stop()


def azurite_connection_string(url: str, key: str = AZURITE_KEY) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={key};"
        f"BlobEndpoint={url}/{AZURITE_ACCOUNT};"
    )


@pytest.fixture
def az_env(az_proxy, monkeypatch):
    """Point the standard Azure variable at azurite through the proxy; yields the proxy."""
    for var in (
        "AZURE_STORAGE_ACCOUNT_NAME",
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_SAS_TOKEN",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_connection_string(az_proxy.url))
    az_proxy.fail()
    return az_proxy


@pytest.fixture
def az_container(az_env):
    """A fresh container on azurite; yields its name."""
    import fsspec

    name = f"test-{uuid.uuid4().hex[:12]}"
    fsspec.filesystem("abfs", use_listings_cache=False).mkdir(name)
    return name

"""The shared services of `ckptflow run pipeline --local`: an in-process S3 server, and under
`--isolate` a real MLflow tracking server, each bound to one address.

In process mode they listen on 127.0.0.1. Under `--isolate` the tasks are pods on a bridge, as
on a cluster, and reach the services only over it: both bind the node address of the pods'
bridge (`pods.Node.address`), and the rendered manifest's env (`AWS_ENDPOINT_URL`,
`MLFLOW_TRACKING_URI`) is the only way a step finds them. Both stop when the command ends.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

__all__ = ["S3_BUCKET", "S3_KEYS", "MlflowServer", "free_port", "start_s3"]

S3_BUCKET = "ckptflow-local"
# Fake keys for the fake server; a real deployment's come from the Secret.
S3_KEYS = {"AWS_ACCESS_KEY_ID": "ckptflow-local", "AWS_SECRET_ACCESS_KEY": "ckptflow-local-secret"}
MLFLOW_START_S = 120.0  # the server imports a lot; a busy machine is slow


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start_s3(host: str = "127.0.0.1"):
    """An in-process S3 server (moto) on `host` with the bucket; (server, endpoint)."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    # werkzeug logs every request at INFO: thousands of lines that bury the run's progress.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port(host)
    server = ThreadedMotoServer(ip_address=host, port=port, verbose=False)
    server.start()
    endpoint = f"http://{host}:{port}"
    try:
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=S3_KEYS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=S3_KEYS["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
        ).create_bucket(Bucket=S3_BUCKET)
    except BaseException:
        server.stop()
        raise
    return server, endpoint


class MlflowServer:
    """`mlflow server` on `host`, its backend store (SQLite) and artifacts under `directory`;
    artifacts are proxied by the server (`mlflow-artifacts:`), so clients need no shared disk.
    Use as a context manager; the server is stopped (its process group) on exit."""

    def __init__(self, host: str, directory: Path, port: int | None = None) -> None:
        self.host, self.port = host, port or free_port(host)
        self.dir = Path(directory)
        self.uri = f"http://{host}:{self.port}"
        self.proc: subprocess.Popen | None = None

    @property
    def store_uri(self) -> str:
        return f"sqlite:///{self.dir / 'mlflow.db'}"

    def __enter__(self) -> MlflowServer:
        self.dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "mlflow", "server", "--host", self.host]
        argv += ["--port", str(self.port), "--workers", "1"]
        argv += ["--backend-store-uri", self.store_uri]
        argv += ["--artifacts-destination", str(self.dir / "artifacts")]
        argv += ["--allowed-hosts", f"{self.host}:{self.port},{self.host}"]
        # No job runner: a dozen worker processes (GenAI jobs) the pipeline never uses.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        log = open(self.dir / "server.log", "ab")  # noqa: SIM115 - the child holds it
        try:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.dir, env=env,
            )  # fmt: skip
        finally:
            log.close()
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + MLFLOW_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited ({self.proc.returncode}); see {self.dir / 'server.log'}"
                )
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        raise RuntimeError(
            f"mlflow server not healthy after {MLFLOW_START_S:.0f}s; see {self.dir / 'server.log'}"
        )

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 15)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)
            self.proc.wait()

    def __exit__(self, *exc) -> None:
        self.stop()

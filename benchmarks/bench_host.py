"""The host a benchmark run measures: a description of its machine (CPU, memory, disk,
software, load) for the report, and moto's S3 server in the process for the s3 backend."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import uuid


def start_s3() -> tuple[object, str]:
    """moto's ThreadedMotoServer in this process (as tests/conftest.py); children inherit env."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    os.environ.update(
        AWS_ENDPOINT_URL=url,
        AWS_ACCESS_KEY_ID="bench-key-id",
        AWS_SECRET_ACCESS_KEY="bench-secret",
        AWS_DEFAULT_REGION="us-east-1",
    )
    os.environ.pop("AWS_PROFILE", None)
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=url).create_bucket(Bucket=bucket)
    return server, bucket


def _lines(path: str) -> list[str]:
    with open(path) as f:
        return f.readlines()


def machine(path: str) -> dict:
    """CPU, memory, the disk under `path`, software versions, and how loaded the machine was."""
    import safetensors
    import torch
    import zstandard

    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in _lines("/proc/cpuinfo")
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    mem = next(int(ln.split()[1]) for ln in _lines("/proc/meminfo") if ln.startswith("MemTotal"))
    dev = subprocess.run(
        ["df", "--output=source,fstype,size", path], capture_output=True, text=True
    )
    src = dev.stdout.split("\n")[1].split() if dev.returncode == 0 else ["?"]
    if len(src) == 3:  # df reports 1K blocks
        src[2] = f"{int(src[2]) / (1 << 20):.0f} GiB"
    blk = os.path.basename(src[0])
    rot = f"/sys/block/{blk}/queue/rotational"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem / (1 << 20), 1),
        "disk": " ".join(src),
        "rotational": _lines(rot)[0].strip() if os.path.exists(rot) else "?",
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "zstandard": zstandard.__version__,
        "safetensors": safetensors.__version__,
        "loadavg_at_end": os.getloadavg(),
    }

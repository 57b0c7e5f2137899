"""The benchmark's host: its machine description and its in-process S3 server."""

from __future__ import annotations

import os

import boto3

from benchmarks import bench_host


def test_the_machine_is_described_for_the_report(tmp_path):
    m = bench_host.machine(str(tmp_path))
    assert m["cores"] == os.cpu_count() and m["memory_gib"] > 0
    assert m["disk"] and m["kernel"] and m["torch"] and m["zstandard"]
    assert len(m["loadavg_at_end"]) == 3


def test_the_s3_server_serves_its_bucket(monkeypatch):
    # start_s3 sets these for the children it serves: set here first, monkeypatch puts back
    # (or removes) each after the test, so no other test of this worker sees the server.
    for key in (
        "AWS_ENDPOINT_URL",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_DEFAULT_REGION",
        "AWS_PROFILE",
    ):
        monkeypatch.setenv(key, "unset")
    server, bucket = bench_host.start_s3()
    try:
        s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
        s3.put_object(Bucket=bucket, Key="k", Body=b"v")
        assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"
    finally:
        server.stop()

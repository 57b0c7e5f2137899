"""Junk step folders cost no request each (issue 37): on S3 a root with 1,100 step folders of
junk made an import of a tiny step take 54 s and `ls` + a gc dry run 93 s. The requests of the
commit list, the listing and a gc dry run must not grow with the junk folders' number
(benchmarks/junk_steps.py measures the time)."""

from __future__ import annotations

from collections import Counter

import boto3
import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer

from ckptflow.core import listing, rootreader
from ckptflow.core.gc import gc
from ckptflow.core.storage import Storage

pytestmark = [pytest.mark.s3, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]


class CountingStorage(Storage):
    """Counts the backend calls (every object-store request goes through `_io`)."""

    def __init__(self, uri: str, counts: Counter):
        super().__init__(uri)
        self.counts = counts

    def _io(self, fn, *args, **kw):
        self.counts[getattr(fn, "__name__", "call")] += 1
        return super()._io(fn, *args, **kw)


def _requests(root: str) -> dict[str, int]:
    out = {}
    for what, fn in {
        "committed_steps": rootreader.committed_steps,
        "ls": lambda st: listing.build_rows(st, now=2e9),
        "gc dry run": lambda st: gc(st.uri, "last=1", storage=st, now=2e9),
    }.items():
        counts: Counter = Counter()
        fn(CountingStorage(root, counts))
        out[what] = sum(counts.values())
    return out


def _junk(bucket: str, prefix: str, first: int, n: int) -> None:
    s3 = boto3.client("s3", endpoint_url=boto3.session.Session().client("s3").meta.endpoint_url)
    for i in range(first, first + n):
        s3.put_object(Bucket=bucket, Key=f"{prefix}/step-{1000 + i:08d}/junk.bin", Body=b"x")


def test_requests_follow_committed_steps_not_junk_folders(s3_bucket):
    root = f"s3://{s3_bucket}/run/ckpt"
    ck = Checkpointer(root, threads=2)
    ck.save(1, {"w": torch.ones(8)})
    ck.save(2, {"w": torch.full((8,), 2.0)})
    ck.close()
    _junk(s3_bucket, "run/ckpt", 0, 3)
    few = _requests(root)
    _junk(s3_bucket, "run/ckpt", 3, 40)
    many = _requests(root)
    assert rootreader.committed_steps(Storage(root)) == [1, 2]
    assert many == few, f"requests with 3 junk folders {few}, with 43 {many}"

"""What junk step folders cost on S3 (issue 37): a root on moto's in-process S3 server with one
committed step and N step folders that hold junk (no COMMIT), then the times of `ckpt import`
of a 32-byte torch.save file, `ckpt ls`, `ckpt gc --policy last=1` (a dry run) and
`Checkpointer.load()`, and the S3 requests each made. Listing cost should follow the committed
steps, not the junk.

    .venv/bin/python benchmarks/junk_steps.py [N]   # N junk folders, default 1100
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
import time
from collections import Counter

import boto3
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_host import start_s3  # noqa: E402


def _count_requests() -> Counter:
    """S3 requests by operation, counted through botocore's event hooks of every client."""
    import botocore.session

    counts: Counter = Counter()
    real = botocore.session.Session.create_client

    def create_client(self, *a, **kw):
        client = real(self, *a, **kw)
        client.meta.events.register(
            "before-call.s3", lambda model, **_: counts.update([model.name])
        )
        return client

    botocore.session.Session.create_client = create_client
    with contextlib.suppress(ImportError):
        import aiobotocore.session

        areal = aiobotocore.session.AioSession._create_client

        async def acreate(self, *a, **kw):
            client = await areal(self, *a, **kw)
            client.meta.events.register(
                "before-call.s3", lambda model, **_: counts.update([model.name])
            )
            return client

        aiobotocore.session.AioSession._create_client = acreate
    return counts


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 1100
    _server, bucket = start_s3()
    counts = _count_requests()
    from ckptflow.steps.checkpoint import Checkpointer

    from ckptflow.ckpt_cli import main as ckpt

    root = f"s3://{bucket}/run/ckpt"
    ck = Checkpointer(root, threads=2)
    ck.save(1, {"w": torch.ones(8)})
    ck.close()
    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    for i in range(n):  # junk: a folder named like a step, holding no COMMIT
        s3.put_object(Bucket=bucket, Key=f"run/ckpt/step-{1000 + i:08d}/junk.bin", Body=b"x")
    src = os.path.join(tempfile.mkdtemp(), "tiny.pt")
    torch.save({"w": torch.ones(8)}, src)  # a 32-byte tensor

    def timed(what: str, fn) -> None:
        counts.clear()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            rc = fn()
        dt = time.perf_counter() - t0
        reqs = ", ".join(f"{k} {v}" for k, v in counts.most_common())
        print(f"{what:<34} {dt:7.2f} s  -> {rc}  {sum(counts.values())} requests ({reqs})")

    print(f"root {root}: 1 committed step, {n} junk step folders")
    timed(
        "ckpt import (32-byte torch file)",
        lambda: ckpt(["import", src, "--to", root, "--step", "2"]),
    )
    timed("ckpt ls", lambda: ckpt(["ls", root]))
    timed("ckpt gc --policy last=1 (dry run)", lambda: ckpt(["gc", root, "--policy", "last=1"]))
    timed("Checkpointer.load()", lambda: Checkpointer(root, threads=2).load({"w": torch.zeros(8)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

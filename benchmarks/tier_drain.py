"""The drain of a local step into the durable root against a direct durable save (issue 35).

    .venv/bin/python benchmarks/tier_drain.py [--mib 256] [--repeats 3] [--store file|s3]
                                              [--changed 0.1] [--compress] [--dir /var/tmp]

One process. A state of about --mib MiB (random fp32 tensors of 16 MiB, plus small values) is
saved (sync) into a local rank root (the local tier's layout, a PIECE written as a one-rank
fan-out does), then drained into an empty durable root (`drain`: each object read once from
local disk, hashed, uploaded; manifest; commit), and, for comparison, saved directly into
another empty durable root by a fresh Checkpointer (an async save, its snapshot buffers
prepared as the training loop's are: snapshot, encode, hash, upload, commit) with the same
compression; the stall each costs the training thread is printed too. Then a second step
with --changed of the tensors changed: its drain uploads only those (the rest is there), the
direct save deduplicates against its previous save. `--store s3` puts the durable roots on
moto's S3 server in this process (loopback HTTP). Prints seconds of each (medians over
--repeats) and the bytes each uploaded. Both store uncompressed (what `auto` chooses for
random fp32 on local disk) unless --compress (what `auto:always` does on S3; the local tier
then compresses as the durable root would, local_save.compress_like, and the drain does not
compress again). The local disk is the same disk as a `file` durable root's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

TENSOR_MIB = 16


def make_state(mib: int, seed: int) -> dict:
    """Random fp32 tensors of TENSOR_MIB MiB each (about `mib` MiB) and a few values."""
    g = torch.Generator().manual_seed(seed)
    n = max(1, mib // TENSOR_MIB)
    state = {f"t{i}": torch.randn(TENSOR_MIB << 18, generator=g) for i in range(n)}
    state["step"] = 0
    state["sched"] = {"lr": 1e-3}
    return state


def change(state: dict, share: float, step: int) -> dict:
    """A copy of `state` at `step` whose first `share` of the tensors changed."""
    out = dict(state, step=step)
    names = sorted(k for k, v in state.items() if isinstance(v, torch.Tensor))
    for k in names[: max(1, round(len(names) * share))]:
        out[k] = state[k] + 1.0
    return out


def _s3_root() -> tuple[str, object]:
    """A fresh bucket on moto's S3 server started in this process: (a root prefix, server)."""
    import boto3
    from moto.server import ThreadedMotoServer

    from tests.steps.distworkers import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).create_bucket(Bucket=bucket)
    return f"s3://{bucket}", server


def one_round(
    base: Path, durable_base: str, i: int, mib: int, changed: float, compress: bool
) -> dict:
    from ckptflow.steps.checkpoint import Checkpointer
    from ckptflow.steps.checkpoint.tier.drain import drain

    from ckptflow.core import tier
    from tests.steps.tier_drain_helpers import save_piece

    drained, direct = f"{durable_base}/drained-{i}", f"{durable_base}/direct-{i}"
    root = tier.piece_root(str(base / f"local-{i}"), tier.run_key(drained), 0)
    local = Checkpointer(root, compress=compress)
    state = make_state(mib, seed=i)
    t0 = time.perf_counter()
    save_piece(local, 1, state)
    row = {"local_save_s": time.perf_counter() - t0}
    ck = Checkpointer(drained, compress=compress)
    t0 = time.perf_counter()
    stats = drain(ck, local.storage, 1).wait()
    row.update(drain_s=time.perf_counter() - t0, drain_bytes=stats.bytes_written)
    row["drain_stall_s"] = stats.stall_s
    direct_ck = Checkpointer(direct, compress=compress)
    direct_ck.prepare(state)  # its snapshot buffers ready, as the loop's are
    time.sleep(1.0)
    t0 = time.perf_counter()
    s = direct_ck.save(1, state, block=False).wait()
    row.update(direct_s=time.perf_counter() - t0, direct_bytes=s.bytes_written)
    row["direct_stall_s"] = s.stall_s
    state2 = change(state, changed, 2)
    save_piece(local, 2, state2)
    t0 = time.perf_counter()
    stats = drain(ck, local.storage, 2).wait()
    row.update(drain2_s=time.perf_counter() - t0, drain2_bytes=stats.bytes_written)
    t0 = time.perf_counter()
    s = direct_ck.save(2, state2, block=False).wait()
    row.update(direct2_s=time.perf_counter() - t0, direct2_bytes=s.bytes_written)
    for c in (ck, direct_ck, local):
        c.close()
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=256, help="size of the state in MiB")
    ap.add_argument("--repeats", type=int, default=3, help="rounds (medians are printed)")
    ap.add_argument("--store", choices=("file", "s3"), default="file", help="durable roots")
    ap.add_argument("--changed", type=float, default=0.1, help="share changed at step 2")
    ap.add_argument("--dir", default="/var/tmp", help="where the temporary folders go")
    ap.add_argument(
        "--compress", action="store_true", help="compress both (what auto:always does on S3)"
    )
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="ckptflow-drain-bench-", dir=args.dir))
    server = None
    try:
        if args.store == "s3":
            durable_base, server = _s3_root()
        else:
            durable_base = str(base / "durable")
        rows = [
            one_round(base, durable_base, i, args.mib, args.changed, args.compress)
            for i in range(args.repeats)
        ]
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        doc = {"mib": args.mib, "store": args.store, "compress": args.compress, "median": med}
        print(json.dumps(doc, indent=1))
        print(
            f"step 1: drain {med['drain_s']:.2f}s vs direct save {med['direct_s']:.2f}s "
            f"({med['drain_s'] / med['direct_s']:.2f}); step 2 ({args.changed:.0%} changed): "
            f"drain {med['drain2_s']:.2f}s vs direct {med['direct2_s']:.2f}s; "
            f"local save {med['local_save_s']:.2f}s; stall: drain {med['drain_stall_s']:.4f}s, "
            f"direct async save {med['direct_stall_s']:.4f}s"
        )
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Scale benchmark (issue 36): ckptflow against DCP at many ranks, and S3 requests per rank.

    .venv/bin/python benchmarks/scale.py --shapes 4x200,16x200,32x50,64x20 --rounds 3
    .venv/bin/python benchmarks/scale.py --requests 2,4,8,16          # moto, no timing
    .venv/bin/python benchmarks/scale.py ... --write-docs             # the scale section

Timing: `world` gloo ranks on this host, each with its own `tensors` small fp32 tensors
(`--numel` elements each). Each round saves the state (changed every round, so nothing is
deduplicated) with ckptflow and with DCP, and loads it back with each (a fresh Checkpointer,
newest step: a restart), in an order shuffled from round to round. A phase's time is from a
barrier before it to a barrier after it on every rank (what the job waits for), each phase
begun on a collected heap (gc.collect(), not timed; see _timed). Reported:
medians over rounds and the median of the per-round ratios ckptflow/DCP.

Requests: the same save and load on moto's S3 (benchmarks/s3_requests.py), each rank with an
access key of its own, so the server counts each rank's requests (save, then a fresh
Checkpointer's load).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from benchmarks.scale_report import host, markdown, write_docs  # noqa: E402

SECRET = "testing-secret"


def state_for(rank: int, tensors: int, numel: int, seed: int = 0) -> dict:
    """This rank's own tensors (names no other rank has), random fp32."""
    import torch

    g = torch.Generator().manual_seed(seed * 100_003 + rank)
    return {f"rank{rank}.t{i}": torch.randn(numel, generator=g) for i in range(tensors)}


def _storage(uri: str, endpoint: str | None, key: str | None):
    from ckptflow.core.storage import Storage, StorageOptions

    if endpoint is None:
        return Storage(uri)
    opts = StorageOptions(endpoint_url=endpoint, region="us-east-1", credentials=(key, SECRET))
    return Storage(uri, options=opts)


def _spawn(world: int, fn, *args) -> list:
    """fn(rank, world, *args) on `world` gloo ranks (processes); every rank's return value."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, fn, args, q)) for r in range(world)]
    for p in procs:
        p.start()
    got = [q.get() for _ in procs]
    for p in procs:
        p.join(60)
    errors = [g for g in got if g[0] == "error"]
    if errors:
        raise RuntimeError(f"rank {errors[0][1]} failed:\n{errors[0][2]}")
    return [v for _, _, v in sorted(got, key=lambda g: g[1])]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, fn, args, q) -> None:
    import warnings

    import torch
    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        value = fn(rank, world, *args)
        dist.barrier()
        q.put(("ok", rank, value))
    except BaseException:
        q.put(("error", rank, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# -- requests on S3 ----------------------------------------------------------------------------
def requests_worker(
    rank: int, world: int, endpoint: str, uri: str, tensors: int, numel: int, manifests="auto"
):
    """Save then load (a fresh Checkpointer) on S3, each phase with a key of its own."""
    import torch.distributed as dist
    from ckptflow.steps.checkpoint import Checkpointer

    from benchmarks.s3_requests import rank_key

    state = state_for(rank, tensors, numel)
    save_storage = _storage(uri, endpoint, rank_key(rank, "save"))
    ck = Checkpointer(uri, storage=save_storage, manifests=manifests)
    ck.save(1, state)
    ck.close()
    dist.barrier()
    target = {k: v.clone().zero_() for k, v in state.items()}
    ck = Checkpointer(uri, storage=_storage(uri, endpoint, rank_key(rank, "load")))
    step = ck.load(target)
    ck.close()
    assert step == 1 and all(target[k].equal(v) for k, v in state.items())
    return None


def count_requests(
    worlds: list[int], tensors: int = 8, numel: int = 4096, manifests: str = "auto"
) -> list[dict]:
    """Per world size: each rank's S3 requests on save and on load, by kind."""
    from benchmarks.s3_requests import CountingS3

    server = CountingS3()
    rows = []
    try:
        for world in worlds:
            bucket = f"scale-{uuid.uuid4().hex[:10]}"
            server.make_bucket(bucket)
            server.counts.take()
            uri = f"s3://{bucket}/ckpt"
            _spawn(world, requests_worker, server.url, uri, tensors, numel, manifests)
            counts = server.counts.take()
            rows.append(
                {"world": world, "tensors": tensors, "manifests": manifests, "counts": counts}
            )
    finally:
        server.close()
    return rows


def summarize_requests(rows: list[dict]) -> list[dict]:
    """Per world size: requests of rank 0 and the most and fewest of any other rank."""
    out = []
    for row in rows:
        c, w = row["counts"], row["world"]
        rec = {"world": w, "tensors": row["tensors"], "manifests": row.get("manifests", "auto")}
        for phase in ("save", "load"):
            per = [sum(c.get((phase, r), {}).values()) for r in range(w)]
            others = per[1:] or per
            rec[phase] = {
                "rank0": per[0],
                "others_max": max(others),
                "others_min": min(others),
                "rank0_kinds": dict(sorted(c.get((phase, 0), {}).items())),
                "other_kinds": dict(sorted(c.get((phase, w - 1), {}).items())),
            }
        out.append(rec)
    return out


# -- timing ------------------------------------------------------------------------------------
def _timed(fn) -> float:
    """A phase from a barrier to a barrier, begun on a collected heap (not timed): a full
    collection then falls in the phase whose own allocations set it off. Without it, each
    rank's next full collection (synchronized: every rank allocates alike, ~0.15 s of CPU
    each, all ranks on 2 cores) fell in whichever phase crossed the threshold, the same
    ones in every run (the order is seeded): 3x on 32x50's load while other phases made
    most of the garbage."""
    import gc

    import torch.distributed as dist

    gc.collect()
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - t0


def timing_worker(
    rank: int,
    world: int,
    root: str,
    tensors: int,
    numel: int,
    rounds: int,
    compress="auto",
    manifests="auto",
):
    """Every round: both saves and both loads, in the round's shuffled order (same on every
    rank: the seed is the round). Returns (on every rank) {phase: [seconds per round]}."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from ckptflow.steps.checkpoint import Checkpointer

    state = state_for(rank, tensors, numel)
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    saver = Checkpointer(f"{root}/ckptflow", compress=compress, manifests=manifests)
    dcp_dir = f"{root}/dcp"
    saver.save(0, state)  # the first save of each pays its one-time setup outside the rounds
    dcp.save(state, checkpoint_id=f"{dcp_dir}/0")
    times: dict = {p: [] for p in ("ckptflow-save", "dcp-save", "ckptflow-load", "dcp-load")}
    for rnd in range(1, rounds + 1):
        for t in state.values():
            t.add_(1.0)  # new bytes every round: no save deduplicates against the last
        step = rnd
        phases = {
            "ckptflow-save": lambda s=step: saver.save(s, state),
            "dcp-save": lambda s=step: dcp.save(state, checkpoint_id=f"{dcp_dir}/{s}"),
            "ckptflow-load": lambda: _ckptflow_load(root, target),
            "dcp-load": lambda s=step: dcp.load(target, checkpoint_id=f"{dcp_dir}/{s - 1}"),
        }
        order = list(phases)
        random.Random(rnd).shuffle(order)
        for name in order:
            times[name].append(_timed(phases[name]))
    saver.close()
    ok = all(target[k].shape == v.shape for k, v in state.items())
    dist.barrier()
    return {"times": times, "ok": ok, "written": _written(f"{root}/ckptflow", rounds)}


def _written(uri: str, step: int) -> str:
    """What the save wrote: per-rank manifests (format 5) or one manifest."""
    from ckptflow.core import rootreader
    from ckptflow.core.storage import Storage

    return "rank" if rootreader.read_index(Storage(uri), step) else "step"


def _ckptflow_load(root: str, target: dict) -> None:
    from ckptflow.steps.checkpoint import Checkpointer

    ck = Checkpointer(f"{root}/ckptflow")  # a restart: a fresh Checkpointer, newest step
    ck.load(target)
    ck.close()


def run_shape(
    world: int,
    tensors: int,
    numel: int,
    rounds: int,
    base: str,
    compress="auto",
    manifests="auto",
) -> dict:
    root = tempfile.mkdtemp(prefix=f"scale-{world}x{tensors}-", dir=base)
    try:
        args = (root, tensors, numel, rounds, compress, manifests)
        got = _spawn(world, timing_worker, *args)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    times = got[0]["times"]
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = {
        op: statistics.median(
            c / d for c, d in zip(times[f"ckptflow-{op}"], times[f"dcp-{op}"], strict=True)
        )
        for op in ("save", "load")
    }
    return {
        "world": world,
        "tensors": tensors,
        "numel": numel,
        "compress": compress,
        "manifests": manifests,
        "written": got[0]["written"],
        "median_s": med,
        "ratio": ratio,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="", help="WORLDxTENSORS,... (e.g. 4x200,64x20)")
    ap.add_argument("--numel", type=int, default=16384, help="fp32 elements per tensor")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--compress", default="auto", choices=["auto", "true", "false"], help="ckptflow's saves"
    )
    ap.add_argument(
        "--manifests",
        default="auto",
        help="ckptflow's manifests option, or several side by side (e.g. step,rank)",
    )
    ap.add_argument("--requests", default="", help="world sizes to count S3 requests at")
    ap.add_argument("--req-tensors", type=int, default=8, help="tensors per rank (requests)")
    ap.add_argument(
        "--req-numel",
        type=int,
        default=300_000,
        help="fp32 elements each (over the 1 MiB pack threshold: an object each)",
    )
    ap.add_argument("--base", default="/var/tmp", help="where the roots are made")
    ap.add_argument("--before", default="", help="a JSON file of earlier ratios to show")
    ap.add_argument("--json", default="", help="write the results here")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args(argv)
    modes = [m for m in args.manifests.split(",") if m]
    if not modes or set(modes) - {"auto", "step", "rank"}:
        ap.error("--manifests: auto, step or rank (comma-separated)")
    timing = []
    compress = {"auto": "auto", "true": True, "false": False}[args.compress]
    for shape in filter(None, args.shapes.split(",")):
        world, tensors = (int(x) for x in shape.split("x"))
        for mode in modes:
            r = run_shape(world, tensors, args.numel, args.rounds, args.base, compress, mode)
            print(json.dumps(r), flush=True)
            timing.append(r)
    requests = []
    if args.requests:
        worlds = [int(w) for w in args.requests.split(",")]
        for mode in modes:
            rows = count_requests(worlds, args.req_tensors, args.req_numel, mode)
            requests += summarize_requests(rows)
        for r in requests:
            print(json.dumps(r), flush=True)
    before = []
    if args.before:
        with open(args.before) as f:
            before = json.load(f)
    title = (
        "## Scale: many ranks (issue 36)"
        if args.compress == "auto"
        else f"### Many ranks, ckptflow's saves with compress={args.compress}"
    )
    section = markdown(timing, requests, before, host(), title)
    print(section)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"timing": timing, "requests": requests}, f, indent=1)
    if args.write_docs:  # a run of uncompressed saves has a section of its own
        write_docs(section, "scale-ranks" if args.compress == "auto" else "scale-ranks-raw")
    return 0


if __name__ == "__main__":
    sys.exit(main())

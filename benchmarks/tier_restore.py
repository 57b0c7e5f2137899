"""Restore of the same state by source (issue 35): own local copy, a peer's replica over the
side channel (loopback), object storage on local disk and on moto's S3 server.

    .venv/bin/python benchmarks/tier_restore.py [--mib 256] [--repeats 3] [--dir /var/tmp]
                                                [--no-s3] [--docs]

Two gloo ranks (processes), each on a simulated node (a local_dir of its own under a fresh
folder in --dir). The state: each rank's own random fp32 tensors of 16 MiB (--mib in all,
split between the ranks) and a small shared entry, saved uncompressed (the same bytes in every
tier) once by the gang into a durable root on disk, once on S3 (moto in this process, loopback
HTTP) and once into a scratch root from which each rank's piece is made (the objects its load
reads, its PIECE last) on its own node, with a replica on the other node. Each round, timed on
every rank from the restore's start to the end of its gang-wide byte count (the slowest rank
is the gang's time):

- local: tier.restore with both pieces on their own nodes;
- peer: each rank's own copy removed (as on a new node): each fetches its piece from the
  other rank's replica (peers.fetch, hashed on arrival), then loads it;
- store (disk), store (s3): no local tier; Checkpointer.load of the durable root.

Prints medians over --repeats side by side, the ratios against the peer restore, and the
bytes each read from the durable root (Storage.meter, the gang's sum: what a recovery's
`store_bytes` reports). Everything is on one
host and one disk, warm in the page cache after the first round: it measures the software
path of each source, not a network or a cold disk. `--docs` writes the section
"Local tier: restore by source" of docs/benchmarks.md.
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

TENSOR_MIB = 16
SOURCES = ("local", "peer", "store (disk)", "store (s3)")


def rank_state(rank: int, mib_per_rank: int, step: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(rank * 7919 + step)
    n = max(1, mib_per_rank // TENSOR_MIB)
    mine = {f"t{i}": torch.randn(TENSOR_MIB << 18, generator=g) for i in range(n)}
    return {"mine": {f"rank{rank}": mine}, "shared": torch.arange(1024.0), "step": step}


def template(rank: int, mib_per_rank: int) -> dict:
    import torch

    n = max(1, mib_per_rank // TENSOR_MIB)
    mine = {f"t{i}": torch.empty(TENSOR_MIB << 18) for i in range(n)}
    return {"mine": {f"rank{rank}": mine}, "shared": torch.empty(1024), "step": -1}


def make_piece(scratch: str, step: int, rank: int, world: int, state: dict, dest: str) -> None:
    """Rank `rank`'s piece of `step` under root `dest`: the objects of the items its state
    loads (a full save: no delta bases), marker, manifest, COMMIT, then its PIECE."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    from ckptflow.core import layout, rootreader, tier
    from ckptflow.core.storage import Storage

    src = Storage(scratch)
    m = rootreader.read_manifest(src, step)
    name = layout.manifest_name(rootreader.read_commit(src, step)["save_id"])
    fqns = set(flatten_state_dict(state)[0])
    keys = {p["object"] for it in m["items"].values() if it["fqn"] in fqns for p in it["parts"]}
    piece = tier.new_piece(rank, world, step, name, {k: m["objects"][k]["size"] for k in keys})
    out = Storage(dest)
    for rel in tier.piece_files(piece)[:-1]:
        os.makedirs(os.path.dirname(out.path(rel)), exist_ok=True)
        shutil.copyfile(src.path(rel), out.path(rel))
    tier.write_piece(out, piece)


def _gang_max(seconds: float) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def worker(rank: int, world: int, base: str, s3: str | None, mib: int, repeats: int, out: str):
    """Every round of every source on this rank; rank 0 writes the gang's times to `out`."""
    import torch.distributed as dist
    from ckptflow.steps.checkpoint import Checkpointer
    from ckptflow.steps.checkpoint.tier import peers
    from ckptflow.steps.checkpoint.tier.restore import TierSource, restore

    from ckptflow.core import tier

    step, per_rank = 10, max(TENSOR_MIB, mib // world)
    state = rank_state(rank, per_rank, step)
    roots = {"store (disk)": f"{base}/durable", "scratch": f"{base}/scratch"}
    if s3:
        roots["store (s3)"] = s3
    for root in roots.values():
        # the scratch save stands in for the local tier's, which writes one manifest
        manifests = "step" if root == roots["scratch"] else "auto"
        with Checkpointer(root, compress=False, manifests=manifests) as ck:
            ck.save(step, state)
    key = tier.run_key(Checkpointer(roots["store (disk)"]).root)
    node = f"{base}/node{rank}"
    own = tier.piece_root(node, key, rank)
    make_piece(roots["scratch"], step, rank, world, state, own)
    other = (rank + 1) % world
    make_piece(
        roots["scratch"],
        step,
        rank,
        world,
        state,
        tier.piece_root(f"{base}/node{other}", key, rank),
    )
    dist.barrier()
    link = peers.PeerLink(node, key, rank)
    directory = peers.PeerDirectory.gather(dist.group.WORLD, rank, f"node{rank}", link)
    src = TierSource(node, key, directory, peers.fetch)
    times: dict[str, list] = {s: [] for s in SOURCES if s != "store (s3)" or s3}
    try:
        for _ in range(repeats):
            for source in times:
                if source == "peer":
                    shutil.rmtree(own)  # this rank's node is new: only the peer's replica
                dist.barrier()
                durable = roots["store (disk)"] if source in ("local", "peer") else roots[source]
                ck = Checkpointer(durable)
                target = template(rank, per_rank)
                t0 = time.perf_counter()
                found = restore(ck, target, src if source in ("local", "peer") else None)
                found.measure()
                seconds = _gang_max(time.perf_counter() - t0)
                found.close()
                ck.close()
                assert (found.step, found.source) == (step, source.split(" ")[0]), found
                times[source].append((seconds, found.store_bytes))
    finally:
        dist.barrier()
        link.close()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"times": times, "mib": per_rank * world}, f)


def report(res: dict, host: dict) -> str:
    """The docs section: medians side by side, ratios against the peer restore."""
    med = {s: statistics.median(t for t, _ in runs) for s, runs in res["times"].items()}
    read = {s: statistics.median(b for _, b in runs) for s, runs in res["times"].items()}
    peer = med["peer"]
    lines = [
        "## Local tier: restore by source",
        "",
        f"`benchmarks/tier_restore.py` (issue 35): 2 gloo ranks on one host restore the same "
        f"{res['mib']} MiB state (random fp32, uncompressed; each rank half of it) from each "
        f"source; the gang's time (slowest rank), median of {len(res['times']['local'])} rounds. "
        "Peer: each rank's own copy removed, fetched from the other rank's replica over the "
        "side channel on loopback, then loaded; store: Checkpointer.load of the durable root "
        "(moto's S3 server in the process for s3). One disk, warm page cache: the software "
        "path of each source, not a network.",
        "",
        "| source | restore s | vs peer | bytes read from the durable root |",
        "|---|---|---|---|",
    ]
    for s in res["times"]:
        lines.append(f"| {s} | {med[s]:.3f} | {med[s] / peer:.2f} | {int(read[s]):,} |")
    lines += [
        "",
        "A peer restore is the fetch (each object hashed as it arrives and written to the "
        "rank's local volume, the piece checked whole, PIECE last) then the load of that "
        "local copy (hashed again as it is read); a local restore hashes the piece before "
        "use, then loads it. Local and peer restores read nothing from the durable root (its "
        "listing only); a store restore reads the whole state from it. Moto here is loopback "
        "HTTP on the same host: a real object store over a network, shared by the whole gang, "
        "is slower, while each peer serves only the replicas it holds.",
    ]
    load = ", ".join(f"{x:.1f}" for x in host["loadavg_at_end"])
    lines += ["", f"Host: {host['cpu']}, {host['cores']} cores, {host['disk']}; load {load}."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=256, help="state size in MiB (both ranks)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds (medians are printed)")
    ap.add_argument("--dir", default="/var/tmp", help="where the temporary folders go")
    ap.add_argument("--no-s3", action="store_true", help="skip the S3 (moto) source")
    ap.add_argument("--docs", action="store_true", help="write the docs/benchmarks.md section")
    args = ap.parse_args(argv)
    from benchmarks import bench_host, docs_section
    from tests.steps import distworkers as dw

    server, s3 = None, None
    if not args.no_s3:
        server, bucket = bench_host.start_s3()
        s3 = f"s3://{bucket}/durable"
    base = tempfile.mkdtemp(prefix="ckptflow-restore-bench-", dir=args.dir)
    try:
        out = f"{base}/result.json"
        dw.spawn(2, worker, base, s3, args.mib, args.repeats, out)
        with open(out) as f:
            res = json.load(f)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        if server is not None:
            server.stop()
    host = bench_host.machine(args.dir)
    text = report(res, host)
    print(text)
    if args.docs:
        docs_section.write_section("tier_restore", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

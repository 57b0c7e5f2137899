"""Peer replication throughput of the local tier's side channel on loopback (issue 35).

    .venv/bin/python benchmarks/tier_peers.py [--mib 256] [--repeats 3] [--dir /var/tmp]

One process, two PeerLinks on 127.0.0.1 with local_dirs of their own under a fresh temporary
folder (--dir): a piece of about --mib MiB (a Checkpointer save of random fp32, uncompressed,
plus its PIECE) is pushed from rank 0 to rank 1 (`push_piece`: the objects, marker, manifest,
COMMIT, PIECE; the receiver hashes every object as it lands), pushed again (every object
already held: only the small files go), then fetched from rank 1 into an empty third folder
(`fetch`: hashed on arrival, checked whole, PIECE written last). Prints MB/s (10^6 bytes) of
each, medians over --repeats. Loopback and one disk: this measures the protocol's CPU and
disk cost, not a network.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ckptflow.steps.checkpoint.tier.peers import (
    PeerDirectory,
    PeerEntry,
    PeerLink,
    fetch,
    push_piece,
)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from tests.steps.tier_peer_fixtures import RUN_KEY, rank_root, save_piece  # noqa: E402

TOKEN = "5a" * 16


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=256, help="size of the piece in MiB")
    ap.add_argument("--repeats", type=int, default=3, help="rounds (medians are printed)")
    ap.add_argument("--dir", default="/var/tmp", help="where the temporary folders go")
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="ckptflow-peers-bench-", dir=args.dir))
    try:
        piece = save_piece(rank_root(base / "a", 0), steps=(1,), size=args.mib << 20)[1]
        print(f"piece: {piece.bytes / 1e6:.1f} MB in {len(piece.objects)} objects")
        rounds = {"push": [], "push again": [], "fetch": []}
        for i in range(args.repeats):
            dirs = [base / "a", base / f"b{i}"]
            links = [PeerLink(str(d), RUN_KEY, r, host="127.0.0.1") for r, d in enumerate(dirs)]
            for link in links:
                link.token = TOKEN
            directory = PeerDirectory(
                tuple(PeerEntry(r, *lk.address, f"n{r}", TOKEN) for r, lk in enumerate(links))
            )
            try:
                t0 = time.perf_counter()
                sent = push_piece(directory.entries[1], piece)
                t1 = time.perf_counter()
                again = push_piece(directory.entries[1], piece)
                t2 = time.perf_counter()
                got = fetch(directory.entries[1], 0, 1, str(rank_root(base / f"c{i}", 0)))
                t3 = time.perf_counter()
            finally:
                for link in links:
                    link.close()
            rounds["push"].append((sent, t1 - t0))
            rounds["push again"].append((again, t2 - t1))
            rounds["fetch"].append((got, t3 - t2))
            shutil.rmtree(base / f"b{i}")
            shutil.rmtree(base / f"c{i}")
        for name, runs in rounds.items():
            seconds = statistics.median(s for _, s in runs)
            moved = statistics.median(b for b, _ in runs)
            rate = f", {piece.bytes / seconds / 1e6:.0f} MB/s" if name != "push again" else ""
            print(f"{name:>10}: {seconds:.3f} s, {moved / 1e6:.1f} MB moved{rate}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Peer replicas across a real gloo gang of two processes (issue 35): the directory and the
token go through all_gather_object, rank 0's piece is replicated to rank 1 (on another node)
while training would go on, and a third folder fetches it back from rank 1."""

from __future__ import annotations

import json
from pathlib import Path

import torch.distributed as dist

from ckptflow.core import tier
from ckptflow.core.storage import Storage
from tests.steps import distworkers as dw
from tests.steps.tier_peer_fixtures import RUN_KEY, rank_root, save_piece


def _gang_worker(rank: int, world: int, base: str) -> None:
    from ckptflow.steps.checkpoint.tier import peers

    local_dir = Path(base, f"node-{'ab'[rank]}")
    started = peers.start(
        None, rank, str(local_dir), RUN_KEY, replicas=1, keep=2, node=f"node-{'ab'[rank]}",
        host="127.0.0.1", timeout_s=10,
    )  # fmt: skip
    link, directory, replicator = started.link, started.directory, started.replicator
    assert link.token and len(link.token) == 32
    if rank == 0:
        piece = tier.read_piece(Storage(str(rank_root(local_dir, 0))), 9, 0)
        replicator.replicate(9, piece)
        assert replicator.wait(60)
        stats = replicator.stats[1]
    dist.barrier()  # the replica has landed on rank 1
    if rank == 1:
        fresh = rank_root(Path(base, "node-c"), 0)
        got = peers.fetch(directory.entries[1], 0, 9, str(fresh))
        Path(base, "fetched.json").write_text(json.dumps({"bytes": got}))
    else:
        Path(base, "pushed.json").write_text(json.dumps(stats))
    dist.barrier()
    started.close()


def test_replicate_and_fetch_in_a_gloo_gang(tmp_path):
    piece = save_piece(rank_root(tmp_path / "node-a", 0), steps=(9,))[9]
    dw.spawn(2, _gang_worker, str(tmp_path))
    pushed = json.loads((tmp_path / "pushed.json").read_text())
    assert pushed["step"] == 9 and pushed["bytes"] >= piece.bytes
    replica = Storage(str(rank_root(tmp_path / "node-b", 0)))
    assert tier.verify_piece(replica, tier.read_piece(replica, 9, 0)) is None
    fetched = Storage(str(rank_root(tmp_path / "node-c", 0)))
    assert tier.verify_piece(fetched, tier.read_piece(fetched, 9, 0)) is None
    assert json.loads((tmp_path / "fetched.json").read_text())["bytes"] >= piece.bytes

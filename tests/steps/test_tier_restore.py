"""The local tier's restore order on 2 gloo ranks, each on a simulated node (issue 35): own local
copy, a peer's replica (B's side channel), object storage; damaged and partial local copies
skipped; a failure on any rank moves the whole gang; bytes from object storage counted.

One module fixture saves durable steps 2, 4 and 6 and local pieces of steps 3 and 4 on both
nodes (each rank's piece on its node, a replica on the other); each test copies it and
removes or damages what its case needs (durable steps, pieces, replicas, a whole node)."""

from __future__ import annotations

import json
import shutil

import pytest

from ckptflow.core import rootreader, tier
from ckptflow.core.storage import Storage
from tests.steps import distworkers as dw
from tests.steps import tier_restore_workers as w

TENSOR = w.N * 4  # bytes of one rank's own tensor


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("tier") / "gang")
    spec = {"durable": (2, 4, 6), "local": (3, 4), "replicas": (3, 4)}
    dw.spawn(2, w.setup_worker, base, spec)
    return base


class Gang:
    """A copy of the built gang under tmp_path (the run key renamed for its durable URI)."""

    def __init__(self, built: str, tmp_path, durable=(2,)):
        self.base = str(tmp_path / "gang")
        shutil.copytree(built, self.base)
        old = tier.run_key(Storage(w.durable(built)).uri)
        self.key = tier.run_key(Storage(w.durable(self.base)).uri)
        for r in (0, 1):
            shutil.move(f"{w.node(self.base, r)}/{old}", f"{w.node(self.base, r)}/{self.key}")
        for s in {2, 4, 6} - set(durable):
            shutil.rmtree(Storage(w.durable(self.base)).path(f"step-{s:08d}"))
        self.out = str(tmp_path / "out")

    def root(self, on_node: int, rank: int) -> Storage:
        return Storage(tier.piece_root(w.node(self.base, on_node), self.key, rank))

    def objects_of(self, step: int, fqn: str) -> list[str]:
        m = rootreader.read_manifest(Storage(f"{self.base}/scratch"), step)
        return sorted(
            {p["object"] for it in m["items"].values() if it["fqn"] == fqn for p in it["parts"]}
        )

    def drop(self, on_node: int, rank: int, step: int | None = None) -> None:
        """Remove rank `rank`'s pieces (of `step`, or all) from node `on_node`."""
        root = self.root(on_node, rank)
        if step is None:
            shutil.rmtree(root.path())
        else:
            shutil.rmtree(root.path(f"step-{step:08d}"))

    def restore(self) -> list[dict]:
        dw.spawn(2, w.restore_worker, self.base, self.out)
        docs = []
        for r in (0, 1):
            with open(f"{self.out}.{r}") as f:
                docs.append(json.load(f))
        return docs


def _restored(docs: list[dict], step: int, source: str) -> None:
    for r, d in enumerate(docs):
        assert (d["step"], d["source"], d["loaded_step"]) == (step, source, step), (r, d)
        assert d["mine_ok"] and d["shared_ok"], (r, d)
        assert d["rng"] == [step, r]  # the second (RNG) load: same step, same source
    assert docs[0]["store_bytes"] == docs[1]["store_bytes"]  # the gang's total, on every rank


def test_restore_from_own_local_copies_reads_almost_nothing_from_the_store(built, tmp_path):
    docs = Gang(built, tmp_path).restore()
    _restored(docs, 4, "local")  # newer than the durable step 2
    assert docs[0]["store_bytes"] == 0  # the durable root listed, nothing read from it
    assert docs[0]["skipped"] == []


def test_a_rank_on_a_new_node_fetches_its_piece_from_a_peer(built, tmp_path):
    g = Gang(built, tmp_path)
    shutil.rmtree(w.node(g.base, 1))  # node 1 lost: rank 1 comes back on an empty node
    docs = g.restore()
    _restored(docs, 4, "peer")
    assert docs[0]["store_bytes"] == 0
    assert g.root(1, 1).exists(tier.piece_path(4, 1))  # the fetched piece is complete there


def test_a_piece_missing_everywhere_loads_from_the_store_and_counts_its_bytes(built, tmp_path):
    g = Gang(built, tmp_path)
    g.drop(0, 1)
    g.drop(1, 1)
    docs = g.restore()
    _restored(docs, 2, "store")
    assert docs[0]["store_bytes"] > 2 * TENSOR  # each rank's tensor and the shared one


def test_a_damaged_local_object_is_skipped_and_fetched_from_a_peer(built, tmp_path):
    g = Gang(built, tmp_path)
    key = g.objects_of(4, "mine.rank0")[0]
    path = g.root(0, 0).path(f"objects/{key[:2]}/{key}")
    with open(path, "r+b") as f:  # one flipped byte, the size unchanged
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 0xFF]))
    docs = g.restore()
    _restored(docs, 4, "peer")
    assert any(key in s and "checksum" in s for s in docs[0]["skipped"]), docs[0]["skipped"]


def test_a_damaged_local_object_without_a_replica_takes_an_older_complete_step(built, tmp_path):
    g = Gang(built, tmp_path)
    g.drop(1, 0, 4)  # rank 0's replica of step 4 never made it
    key = g.objects_of(4, "mine.rank0")[0]
    with open(g.root(0, 0).path(f"objects/{key[:2]}/{key}"), "r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01\x02")
    docs = g.restore()
    _restored(docs, 3, "local")  # never the damaged step 4, never half of it
    assert any(key in s for s in docs[0]["skipped"])


def test_a_partial_local_piece_is_skipped_and_reported(built, tmp_path):
    g = Gang(built, tmp_path)
    g.drop(1, 0, 4)
    piece = g.root(0, 0).path(tier.piece_path(4, 0))
    shutil.os.remove(piece)  # a save cut short before its PIECE
    docs = g.restore()
    _restored(docs, 3, "local")
    assert any(piece in s and "partial" in s for s in docs[0]["skipped"]), docs[0]["skipped"]


def test_a_replica_only_on_the_lost_node_takes_an_older_step_or_the_store(built, tmp_path):
    g = Gang(built, tmp_path)
    g.drop(0, 1, 4)  # rank 1's step 4 lived only on node 1, now lost
    shutil.rmtree(w.node(g.base, 1))
    _restored(g.restore(), 3, "peer")  # step 3's replica on node 0 survives

    g = Gang(built, tmp_path / "again")
    g.drop(0, 1)  # no replica of rank 1 at all
    shutil.rmtree(w.node(g.base, 1))
    _restored(g.restore(), 2, "store")


def test_local_wins_a_tie_and_a_newer_durable_step_wins(built, tmp_path):
    docs = Gang(built, tmp_path, durable=(2, 4)).restore()
    _restored(docs, 4, "local")
    docs = Gang(built, tmp_path / "newer", durable=(2, 4, 6)).restore()
    _restored(docs, 6, "store")


def test_a_load_failing_on_one_rank_moves_the_whole_gang(built, tmp_path):
    """Rank 1's piece verifies (its PIECE omits an object the load needs) but its load fails:
    rank 0, which loaded step 4 fine, goes with it to step 3: no rank stays on step 4."""
    g = Gang(built, tmp_path)
    root = g.root(1, 1)
    piece = tier.read_piece(root, 4, 1)
    key = g.objects_of(4, "mine.rank1")[0]
    shutil.os.remove(root.path(f"objects/{key[:2]}/{key}"))
    objects = {k: v for k, v in piece.objects.items() if k != key}
    tier.write_piece(root, tier.new_piece(1, 2, 4, piece.manifest, objects))
    docs = g.restore()
    _restored(docs, 3, "local")


def test_a_damaged_peer_replica_is_not_loaded_the_gang_takes_an_older_step(built, tmp_path):
    """Rank 1 on a new node; rank 0's replica of its step 4 has a flipped byte: the fetch
    refuses it (hashed on arrival), so step 4 cannot be assembled; step 3's replica can."""
    g = Gang(built, tmp_path)
    shutil.rmtree(w.node(g.base, 1))
    key = g.objects_of(4, "mine.rank1")[0]
    with open(g.root(0, 1).path(f"objects/{key[:2]}/{key}"), "r+b") as f:
        f.seek(7)
        b = f.read(1)
        f.seek(7)
        f.write(bytes([b[0] ^ 0x01]))
    docs = g.restore()
    _restored(docs, 3, "peer")
    assert not g.root(1, 1).exists(tier.piece_path(4, 1))  # no PIECE for the damaged fetch

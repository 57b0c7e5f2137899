"""Peer replicas of the local tier (issue 35): push and fetch between two servers in one
process (loopback, separate tmp_path folders), the token, peers that are down or silent, a
damaged replica, the superseding queue and replica retention."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import pytest
from ckptflow.steps.checkpoint.tier import peers
from ckptflow.steps.checkpoint.tier.peer_client import PeerClient
from ckptflow.steps.checkpoint.tier.peers import (
    DamagedReplica,
    PeerDirectory,
    PeerEntry,
    PeerError,
    PeerLink,
    Replicator,
    fetch,
    push_piece,
)

from ckptflow.core import layout, tier
from ckptflow.core.storage import Storage
from tests.steps.tier_peer_fixtures import RUN_KEY, rank_root, save_piece

TOKEN = "0f" * 16


@pytest.fixture
def two(tmp_path):
    """Rank 0 (node a, with local pieces of steps 5, 7, 9) and rank 1 (node b), each with its
    own local_dir under tmp_path, servers on loopback with the run's token set."""
    dirs = [tmp_path / "node-a", tmp_path / "node-b"]
    pieces = save_piece(rank_root(dirs[0], 0), steps=(5, 7, 9))
    links = [
        PeerLink(str(d), RUN_KEY, r, keep=2, host="127.0.0.1", timeout_s=5)
        for r, d in enumerate(dirs)
    ]
    for link in links:
        link.token = TOKEN
    directory = PeerDirectory(
        tuple(PeerEntry(r, *link.address, f"node-{'ab'[r]}", TOKEN) for r, link in enumerate(links))
    )
    yield dirs, pieces, links, directory
    for link in links:
        link.close()


def complete(root, step: int, rank: int = 0) -> bool:
    storage = Storage(str(root))
    piece = tier.read_piece(storage, step, rank)
    return piece is not None and tier.verify_piece(storage, piece) is None


def test_push_then_fetch_between_two_servers(two, tmp_path):
    dirs, pieces, links, directory = two
    sent = push_piece(directory.entries[1], pieces[9], timeout_s=5)
    assert sent >= pieces[9].bytes
    assert complete(rank_root(dirs[1], 0), 9)  # the replica on node b is a complete piece
    # a second push of the same piece skips the objects the peer already holds
    assert push_piece(directory.entries[1], pieces[9], timeout_s=5) < pieces[9].bytes
    # a rank that comes back on a new node (an empty local_dir) fetches its piece from b
    fresh = rank_root(tmp_path / "node-c", 0)
    got = fetch(directory.entries[1], 0, 9, str(fresh))
    assert got >= pieces[9].bytes
    assert complete(fresh, 9)
    # objects already there intact are not fetched again
    os.remove(fresh / tier.piece_path(9, 0))
    assert fetch(directory.entries[1], 0, 9, str(fresh)) < pieces[9].bytes
    assert complete(fresh, 9)


def test_the_replicator_copies_in_the_background_and_keeps_the_last_steps(two):
    dirs, pieces, links, directory = two
    rep = Replicator(links[0], directory, 1)
    assert [e.rank for e in rep.holders] == [1]
    for step in (5, 7, 9):
        rep.replicate(step, pieces[step])
        assert rep.wait(30)
    rep.close()
    replica = rank_root(dirs[1], 0)
    assert [p.step for p in tier.list_pieces(str(dirs[1]), RUN_KEY)] == [7, 9]  # keep=2
    assert not (replica / layout.step_dir(5)).exists()
    held = {p.name for p in (replica / "objects").rglob("*") if p.is_file()}
    assert held == set(pieces[7].objects) | set(pieces[9].objects)  # step 5's own ones went
    assert complete(replica, 7) and complete(replica, 9)
    assert rep.stats[1]["step"] == 9 and rep.stats[1]["bytes"] > 0
    links[1].keep = 0  # a volume that holds one step: never fewer than the newest
    assert links[1].keep == 1
    push_piece(directory.entries[1], pieces[9], timeout_s=5)
    assert [p.step for p in tier.list_pieces(str(dirs[1]), RUN_KEY)] == [9]
    assert complete(replica, 9)


def test_a_partial_push_leaves_no_piece(two):
    dirs, pieces, links, directory = two
    piece, source = pieces[9], Storage(str(rank_root(dirs[0], 0)))
    files = tier.piece_files(piece)
    with PeerClient(*links[1].address, TOKEN, 5) as client:
        for rel in files[:-1]:
            if rel != files[1]:  # one object never arrives (the push was cut short)
                client.put_file(0, rel, source.path(rel))
        with pytest.raises(PeerError, match="missing"):
            client.put_file(0, files[-1], source.path(files[-1]))
    assert not (rank_root(dirs[1], 0) / tier.piece_path(9, 0)).exists()
    assert tier.list_pieces(str(dirs[1]), RUN_KEY) == []  # incomplete: never loaded


def test_a_wrong_token_is_refused(two):
    dirs, pieces, links, directory = two
    source = Storage(str(rank_root(dirs[0], 0)))
    with (
        PeerClient(*links[1].address, "ff" * 16, 5) as client,
        pytest.raises(PeerError, match="token"),
    ):
        client.put_file(0, layout.ROOT_MARKER, source.path(layout.ROOT_MARKER))
    links[1].token = None  # before the gang shared it: every request is refused
    with PeerClient(*links[1].address, TOKEN, 5) as client, pytest.raises(PeerError, match="token"):
        client.have(0, pieces[9].objects)
    assert not rank_root(dirs[1], 0).exists()


def test_a_damaged_object_in_a_fetched_piece_is_detected(two, tmp_path):
    dirs, pieces, links, directory = two
    push_piece(directory.entries[1], pieces[9], timeout_s=5)
    key = max(pieces[9].objects, key=pieces[9].objects.get)
    held = rank_root(dirs[1], 0) / layout.object_path(key)
    blob = bytearray(held.read_bytes())
    blob[len(blob) // 2] ^= 0x40  # same size, one bit flipped
    held.write_bytes(bytes(blob))
    fresh = rank_root(tmp_path / "node-c", 0)
    with pytest.raises(DamagedReplica, match=key) as caught:
        fetch(directory.entries[1], 0, 9, str(fresh))
    assert any(key in f for f in caught.value.files)
    assert not (fresh / layout.object_path(key)).exists()  # the damaged bytes were not kept
    assert not (fresh / tier.piece_path(9, 0)).exists()  # nor is the piece complete
    assert not held.exists()  # the holder checked and dropped its damaged copy
    assert tier.verify_piece(Storage(str(rank_root(dirs[1], 0))), pieces[9]) is not None


def test_fetch_of_a_piece_the_peer_lacks(two, tmp_path):
    dirs, pieces, links, directory = two
    with pytest.raises(FileNotFoundError):
        fetch(directory.entries[1], 0, 9, str(rank_root(tmp_path / "node-c", 0)))


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


@pytest.fixture
def silent_peer():
    """A socket that accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held, stop = [], threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join()
    for s in held:
        s.close()
    srv.close()


@pytest.mark.parametrize("peer", ["down", "silent"])
def test_an_unreachable_peer_costs_one_warning_and_never_blocks(two, peer, silent_peer, caplog):
    dirs, pieces, links, directory = two
    port = _dead_port() if peer == "down" else silent_peer
    links[0].timeout_s = 0.5
    bad = PeerDirectory((directory.entries[0], PeerEntry(1, "127.0.0.1", port, "node-b", TOKEN)))
    rep = Replicator(links[0], bad, 1)
    with caplog.at_level(logging.WARNING, logger="ckptflow.tier.peers"):
        t0 = time.monotonic()
        rep.replicate(5, pieces[5])
        rep.replicate(7, pieces[7])
        assert time.monotonic() - t0 < 0.1  # training goes on at once
        assert rep.wait(10)
        took = time.monotonic() - t0
        rep.replicate(9, pieces[9])  # the next step tries again: no second warning
        assert rep.wait(10)
    rep.close()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "rank 1" in warnings[0].getMessage() and "training goes on" in warnings[0].getMessage()
    if peer == "silent":
        assert "within 0.5 s" in warnings[0].getMessage()
    assert took < 2 * 0.5 + 1.5  # at most two steps' timeouts (one pending, one in flight)
    assert rep.stats == {}


def test_a_newer_step_supersedes_the_queued_one(two):
    dirs, pieces, links, directory = two
    started, release, pushed = threading.Event(), threading.Event(), []

    def push(entry, piece, timeout_s):
        pushed.append(piece.step)
        started.set()
        assert release.wait(10)
        return piece.bytes

    rep = Replicator(links[0], directory, 1, push=push)
    rep.replicate(5, pieces[5])
    assert started.wait(10)  # step 5 in flight
    rep.replicate(7, pieces[7])  # queued
    rep.replicate(9, pieces[9])  # supersedes 7
    assert rep.superseded == 1
    release.set()
    assert rep.wait(10)
    rep.close()
    assert pushed == [5, 9]
    assert rep.stats[1]["step"] == 9


def test_gather_shares_addresses_nodes_and_rank0s_token(tmp_path):
    links = [PeerLink(str(tmp_path / f"n{r}"), RUN_KEY, r, host="127.0.0.1") for r in range(3)]
    barrier, slots = threading.Barrier(3), [None] * 3

    class Group:
        def size(self):
            return 3

    def all_gather(out, obj, group):
        rank = [lk.address[1] for lk in links].index(obj["port"])
        slots[rank] = obj
        barrier.wait(10)
        out[:] = list(slots)

    found = [None] * 3

    def run(r):
        found[r] = PeerDirectory.gather(
            Group(), r, f"node-{r % 2}", links[r], all_gather=all_gather
        )

    threads = [threading.Thread(target=run, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    try:
        assert found[0] == found[1] == found[2]
        assert found[0].nodes_by_rank == ["node-0", "node-1", "node-0"]
        assert [(e.host, e.port) for e in found[0].entries] == [lk.address for lk in links]
        assert len({lk.token for lk in links}) == 1 and len(links[0].token) == 32
        assert links[0].token not in repr(found[0])  # never printed
    finally:
        for lk in links:
            lk.close()


def test_peers_api_is_small():
    assert set(peers.__all__) >= {"PeerLink", "PeerDirectory", "Replicator", "fetch"}


def test_a_server_that_cannot_start_is_one_peer_error(tmp_path):
    with pytest.raises(PeerError, match="cannot start the peer server on 192.0.2.1"):
        PeerLink(str(tmp_path), RUN_KEY, 0, host="192.0.2.1")  # TEST-NET: not this host's
    with pytest.raises(PeerError, match="not a local folder"):
        PeerLink("memory://local", RUN_KEY, 0, host="127.0.0.1")
    link = PeerLink(f"file://{tmp_path}", RUN_KEY, 0, host="127.0.0.1")  # a URI works too
    link.close()
    assert (tmp_path / RUN_KEY).is_dir()


def test_an_object_the_holder_lost_is_a_damaged_replica(two, tmp_path):
    dirs, pieces, links, directory = two
    push_piece(directory.entries[1], pieces[9], timeout_s=5)
    key = min(pieces[9].objects)
    os.remove(rank_root(dirs[1], 0) / layout.object_path(key))
    fresh = rank_root(tmp_path / "node-c", 0)
    with pytest.raises(DamagedReplica, match=f"{key}: listed by the PIECE, absent"):
        fetch(directory.entries[1], 0, 9, str(fresh))
    assert not (fresh / tier.piece_path(9, 0)).exists()


def test_the_replicator_survives_an_unexpected_error(two, caplog):
    dirs, pieces, links, directory = two
    calls = []

    def push(entry, piece, timeout_s):
        calls.append(piece.step)
        if len(calls) == 1:
            raise ValueError("something no one expected")
        return push_piece(entry, piece, timeout_s)

    rep = Replicator(links[0], directory, 1, push=push)
    with caplog.at_level(logging.WARNING, logger="ckptflow.tier.peers"):
        rep.replicate(5, pieces[5])
        assert rep.wait(10)
        rep.replicate(7, pieces[7])  # the thread still runs: the next step is copied
        assert rep.wait(30)
    rep.close()
    assert calls == [5, 7] and rep.stats[1]["step"] == 7
    assert "something no one expected" in caplog.text
    assert complete(rank_root(dirs[1], 0), 7)


class _FakeGang:
    """`world` ranks as threads of this process, all_gather_object by a barrier."""

    def __init__(self, world: int):
        self.world, self.barrier, self.slots = world, threading.Barrier(world), [None] * world
        self.rank_of = threading.local()

    def size(self) -> int:
        return self.world

    def all_gather(self, out, obj, group) -> None:
        self.slots[self.rank_of.rank] = obj
        self.barrier.wait(10)
        out[:] = list(self.slots)
        self.barrier.wait(10)

    def run(self, fn) -> list:
        found = [None] * self.world

        def one(r):
            self.rank_of.rank = r
            found[r] = fn(r)

        threads = [threading.Thread(target=one, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        return found


def test_start_gives_every_rank_the_directory_and_a_replicator(tmp_path):
    gang = _FakeGang(2)
    found = gang.run(
        lambda r: peers.start(
            gang, r, str(tmp_path / f"n{r}"), RUN_KEY, replicas=1, node=f"node-{r}",
            host="127.0.0.1", all_gather=gang.all_gather,
        )
    )  # fmt: skip
    try:
        assert found[0].directory == found[1].directory
        assert [e.rank for e in found[0].replicator.holders] == [1]
        assert [e.rank for e in found[1].replicator.holders] == [0]
        assert found[0].link.token == found[1].link.token
    finally:
        for p in found:
            p.close()
    assert peers.start(None, 0, str(tmp_path), RUN_KEY, replicas=0) is None  # no collective


def test_a_rank_whose_server_cannot_start_turns_replicas_off_on_every_rank(tmp_path, caplog):
    gang = _FakeGang(2)
    hosts = ["127.0.0.1", "192.0.2.1"]  # rank 1's is not this host's
    with caplog.at_level(logging.WARNING, logger="ckptflow.tier.peers"):
        found = gang.run(
            lambda r: peers.start(
                gang, r, str(tmp_path / f"n{r}"), RUN_KEY, replicas=1, node=f"node-{r}",
                host=hosts[r], all_gather=gang.all_gather,
            )
        )  # fmt: skip
    assert found == [None, None]  # the gang agrees
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 2 and all("rank 1 has no peer server" in m for m in lines), lines
    assert all("192.0.2.1" in m and "durable tiers go on" in m for m in lines)

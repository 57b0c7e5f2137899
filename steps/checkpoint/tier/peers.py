"""Peer replicas of the local tier (issue 35): a side channel, placement, replication, fetch.

How the pieces fit (the API the training loop and restore use; everything else is internal):

    peers = start(group, rank, local_dir, run_key, replicas=R, keep=local_keep)  # collective
    # None: replicas off (R = 0, or a server could not start: one warning on every rank)
    # restore (C): a rank lacking its piece fetches it from a holder's entry:
    n = fetch(peers.directory.entries[holder], saved_rank, step,
              tier.piece_root(local_dir, run_key, saved_rank))
    ...
    peers.replicate(step, piece)   # after each local commit (A's loop): returns at once
    ...
    peers.close()                  # at the end: the copy in flight finishes, servers stop

`start` is PeerLink (this rank's server), PeerDirectory.gather (one all_gather_object of
every rank's address and node, and rank 0's token) and Replicator (the R holders of
replica_targets), which may also be used one by one.

The side channel is not the training process group: each rank runs a TCP server thread
(peer_server) bound to its pod's address (ckptflow.env.pod_ip; loopback without one) on an
ephemeral port, so replication never blocks training and a dead peer cannot hang a
collective. Requests carry the run's random token (rank 0's, shared by `gather`); every
header, name and size is bounded and validated (peer_wire). Placement (placement.py): a ring
over the sorted node names, so the loss of any one node leaves a copy of every piece.

Failure model: a peer that is down or does not answer within `timeout_s` costs one warning
line (the first failure of a streak; a success after it says so), training goes on and the
next replicated step tries it again. A pushed piece is complete at the peer only once its
PIECE file lands, and the peer writes it only after checking the piece's files (objects are
hashed on arrival), so a push cut short is never loaded. The peer keeps the last `keep`
complete replica steps of each source rank (peer_retention), never fewer than the newest.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass

from ckptflow.steps.checkpoint.tier.peer_client import PeerClient
from ckptflow.steps.checkpoint.tier.peer_server import PeerServer, default_host
from ckptflow.steps.checkpoint.tier.peer_wire import (
    DamagedReplica,
    PeerError,
    PeerTimeout,
    hash_file,
)
from ckptflow.steps.checkpoint.tier.placement import PeerDirectory, PeerEntry, replica_targets

from ckptflow import env
from ckptflow.core import layout, tier
from ckptflow.core.storage import Storage

__all__ = [
    "DamagedReplica",
    "PeerDirectory",
    "PeerEntry",
    "PeerError",
    "PeerLink",
    "PeerTimeout",
    "Peers",
    "Replicator",
    "fetch",
    "replica_targets",
    "start",
]

log = logging.getLogger("ckptflow.tier.peers")

TIMEOUT_S = 30.0  # per socket operation; a body also gets 1 s per MiB (peer_wire.Wire)


class PeerLink:
    """This rank's end of the side channel: its server over <local_dir>/<run_key>/ (taking
    replicas into rank-<src>/ and serving every piece there), the run's token once gathered,
    and the timeout of every request it makes."""

    def __init__(
        self,
        local_dir: str,
        run_key: str,
        rank: int,
        *,
        keep: int = 2,
        host: str | None = None,
        timeout_s: float = TIMEOUT_S,
    ):
        """Start the server (bound to `host`, default the pod's IP, else loopback). PeerError
        when it cannot start (an address this pod does not have, a local_dir that is not a
        local folder): the caller warns once and goes on without replicas."""
        self.local_dir, self.run_key, self.rank = local_dir, run_key, rank
        self.timeout_s = timeout_s
        run_dir = Storage(tier.piece_root(local_dir, run_key, rank).rsplit("/", 1)[0])
        if run_dir.protocol != "file":
            raise PeerError(f"local_dir {local_dir} is not a local folder: no peer server")
        if problem := tier.link_problem(local_dir, run_key, rank):  # never another run's
            raise PeerError(f"no peer server: {problem}")
        bind = host or default_host(env.pod_ip())
        try:
            self.server = PeerServer(
                run_dir.path(), rank, host=bind, keep=keep, timeout_s=timeout_s
            )
        except OSError as exc:
            raise PeerError(f"cannot start the peer server on {bind} ({exc})") from None

    @property
    def address(self) -> tuple[str, int]:
        return self.server.address

    @property
    def token(self) -> str | None:
        return self.server.token

    @token.setter
    def token(self, value: str) -> None:
        self.server.token = value

    @property
    def keep(self) -> int:
        """Complete replica steps kept per source rank (at least the newest one)."""
        return self.server.keep

    @keep.setter
    def keep(self, value: int) -> None:
        # the local tier lowers it when its volume holds fewer steps than local_keep
        self.server.keep = max(1, int(value))

    def close(self) -> None:
        self.server.close()


class Replicator:
    """Copies this rank's local pieces to its replica holders in a background thread.

    `replicate(step, piece)` returns at once; one step waits at most (a newer one supersedes
    it: only the newest piece is worth copying). Per holder, the objects it already has are
    skipped (asked first), the PIECE goes last. `stats` holds per holder the last step it
    completed, the bytes and seconds of that push (for the log and benchmarks)."""

    def __init__(self, link: PeerLink, directory: PeerDirectory, replicas: int, *, push=None):
        self.link = link
        self._push = push or push_piece  # push(entry, piece, timeout_s) -> bytes (tests inject)
        self.holders = directory.targets(link.rank, replicas)
        self.stats: dict[int, dict] = {}
        self.superseded = 0
        self._pending: tuple[int, tier.Piece] | None = None
        self._busy = False
        self._closed = False
        self._failing: set[int] = set()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def replicate(self, step: int, piece: tier.Piece) -> None:
        """Queue `piece` (this rank's, of local step `step`) for its holders; never blocks."""
        if not self.holders:
            return
        with self._cond:
            if self._closed:
                return
            if self._pending is not None:
                self.superseded += 1
                log.debug("replica of step %d superseded by step %d", self._pending[0], step)
            self._pending = (step, piece)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"ckptflow-replicator-{self.link.rank}", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Until nothing is queued or in flight; False when `timeout` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._busy and self._pending is None, timeout)

    def close(self, timeout: float | None = None) -> None:
        """Let the push in flight (and a queued one) finish within `timeout`, then stop."""
        self.wait(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closed)
                if self._pending is None:
                    return
                (step, piece), self._pending, self._busy = self._pending, None, True
            try:
                for entry in self.holders:
                    self._push_to(entry, step, piece)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _push_to(self, entry: PeerEntry, step: int, piece: tier.Piece) -> None:
        """One holder's copy; a failure is one warning line (the first of a streak)."""
        start = time.monotonic()
        try:
            sent = self._push(entry, piece, self.link.timeout_s)
        except Exception as exc:  # noqa: BLE001 - a dead replicator thread would copy nothing more
            if entry.rank not in self._failing:
                self._failing.add(entry.rank)
                log.warning(
                    "replica of local step %d to rank %d (%s:%d, node %s) failed: %s; training "
                    "goes on and the next local step tries again",
                    step, entry.rank, entry.host, entry.port, entry.node, exc,
                )  # fmt: skip
            else:
                log.debug("replica of step %d to rank %d failed again: %s", step, entry.rank, exc)
            return
        seconds = time.monotonic() - start
        if entry.rank in self._failing:
            self._failing.discard(entry.rank)
            log.info(
                "replicas to rank %d (node %s) work again from step %d",
                entry.rank,
                entry.node,
                step,
            )
        self.stats[entry.rank] = {"step": step, "bytes": sent, "seconds": seconds}


@dataclass
class Peers:
    """A started side channel (see `start`): this rank's link, the gang's directory (what
    restore's fetch needs) and the replicator (what the training loop feeds)."""

    link: PeerLink
    directory: PeerDirectory
    replicator: Replicator

    def replicate(self, step: int, piece: tier.Piece) -> None:
        """After a local commit: copy this rank's piece to its holders (returns at once)."""
        self.replicator.replicate(step, piece)

    def close(self, timeout: float | None = 60.0) -> None:
        """At the end of training: let the copy in flight finish (within `timeout`), stop."""
        self.replicator.close(timeout)
        self.link.close()


def start(
    group,
    rank: int,
    local_dir: str,
    run_key: str,
    *,
    replicas: int,
    keep: int = 2,
    node: str | None = None,
    host: str | None = None,
    timeout_s: float = TIMEOUT_S,
    all_gather=None,
) -> Peers | None:
    """Start this rank's side channel: its server, the gang's directory (one collective on
    `group`: every rank calls `start` with the same `replicas`, before a restore that may
    fetch, since the holders serve from then on) and its replicator. None without replicas
    (replicas <= 0), or when any rank's server cannot start: then every rank logs one
    warning and the run goes on with its local and durable tiers. `node`: this rank's node
    (default ckptflow.env.node_name()); `all_gather`: see PeerDirectory.gather."""
    if replicas <= 0:
        return None
    link, problem = None, ""
    try:
        link = PeerLink(local_dir, run_key, rank, keep=keep, host=host, timeout_s=timeout_s)
    except PeerError as exc:
        problem = str(exc)
    try:
        directory = PeerDirectory.gather(
            group, rank, node or env.node_name(), link, problem=problem, all_gather=all_gather
        )
    except PeerError as exc:
        if link is not None:
            link.close()
        log.warning(
            "peer replicas are off for this run: %s; the local and durable tiers go on", exc
        )
        return None
    return Peers(link, directory, Replicator(link, directory, replicas))


def push_piece(entry: PeerEntry, piece: tier.Piece, timeout_s: float = TIMEOUT_S) -> int:
    """Copy `piece` (read from its local root, piece.root) to the peer `entry`: the objects
    it lacks, then marker, manifest and COMMIT, the PIECE last; the bytes sent."""
    source = Storage(piece.root)
    files = tier.piece_files(piece)
    objects = {layout.object_path(k): k for k in piece.objects}
    sent = 0
    with PeerClient(entry.host, entry.port, entry.token, timeout_s) as client:
        held = client.have(piece.rank, piece.objects)
        for rel in files:
            if objects.get(rel) in held:
                continue
            sent += client.put_file(piece.rank, rel, source.path(rel))
    return sent


def fetch(
    entry: PeerEntry, saved_rank: int, step: int, dest_root: str, *, timeout_s: float = TIMEOUT_S
) -> int:
    """Copy the piece of saved rank `saved_rank` at `step` from the peer `entry` into the
    local rank root `dest_root` (e.g. tier.piece_root(local_dir, run_key, saved_rank)); the
    bytes received. Objects `dest_root` already holds intact are not fetched again. Every
    object is hashed as it arrives, the piece is checked whole (tier.verify_piece: marker,
    manifest, COMMIT, every object's size; hashes were checked on arrival) and only then its
    PIECE file is written, so a fetch cut short or damaged leaves no PIECE.

    Raises PeerError when the peer cannot be reached or answers wrong (PeerTimeout after
    `timeout_s` without an answer), FileNotFoundError when it holds no such piece and
    DamagedReplica (a CorruptCheckpoint, naming the file) when its copy is damaged: the
    damaged file is not kept here, and the peer is told (it removes its copy when it finds
    the damage itself). The caller (restore) then tries another holder or the store."""
    dest = Storage(dest_root)
    rel_piece = tier.piece_path(step, saved_rank)
    with PeerClient(entry.host, entry.port, entry.token, timeout_s) as client:
        blob = client.get_bytes(saved_rank, rel_piece)
        url = client.url(saved_rank, rel_piece)
        try:
            piece = tier.parse_piece(blob, url, dest_root)
        except tier.PieceError as exc:
            raise DamagedReplica(str(exc), [url]) from None
        if (piece.rank, piece.step) != (saved_rank, step):
            raise DamagedReplica(f"{url}: PIECE of rank {piece.rank} step {piece.step}", [url])
        got = len(blob)
        for rel in tier.piece_files(piece)[:-1]:
            if rel == layout.ROOT_MARKER and dest.exists(rel):
                continue  # the gang's marker (one root id on every rank): the manifest check tells
            key = rel.rsplit("/", 1)[-1]
            if key in piece.objects and _intact(dest, rel, key, piece.objects[key]):
                continue
            try:
                got += client.get_file(saved_rank, rel, dest.path(rel))
            except FileNotFoundError:  # listed by its PIECE: the holder's copy is incomplete
                what = client.url(saved_rank, rel)
                raise DamagedReplica(f"{what}: listed by the PIECE, absent", [what]) from None
    problem = tier.verify_piece(dest, piece, check_hash=False)
    if problem:
        raise DamagedReplica(f"piece fetched from {entry.host}:{entry.port}: {problem}", [problem])
    tier.write_piece(dest, piece)
    return got


def _intact(dest: Storage, rel: str, key: str, size: int) -> bool:
    """Whether `dest` holds the object `rel` with its size and key (hashed: a damaged local
    copy is fetched again, never trusted for its name)."""
    path = dest.path(rel)
    try:
        return os.path.getsize(path) == size and hash_file(path) == key
    except OSError:
        return False

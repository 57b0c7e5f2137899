"""A rank's peer server: takes the piece files its peers push and serves the pieces it holds.

One thread (stdlib socketserver, a thread per connection, at most `max_connections` at once)
bound to the pod's address on an ephemeral port; it is not the training process group, so a
peer that dies or stalls never blocks a collective. Requests (peer_wire) are:

- have {src, keys: [[key, size], ...]} -> {have: [key, ...]}: the objects of rank-<src> this
  rank holds with that size (a push skips them);
- put {src, path, size} + body: stores a file of rank-<src>'s piece under
  <run_dir>/rank-<src>/path: written to a hidden temporary name and renamed, an object only
  when its bytes hash to its key, a PIECE only when its piece is complete here (so a push
  cut short leaves no PIECE: the step is incomplete and never loaded); then the replica
  retention of rank-<src> runs (peer_retention). Puts into the rank's own folder are refused:
  its local saves are not a peer's to change;
- get {src, path} -> {size} + body: a file of a piece this rank holds (its own or a replica);
- damaged {src, path}: a fetcher found that object damaged; the server hashes it itself and
  removes it when it is, so the piece is incomplete here too.

Every request must carry the run's token (refused, and the connection dropped, until one is
set). Headers, sizes and names are bounded and validated (peer_wire), a body must fit the
volume's free space, and every socket operation has `timeout_s`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import socketserver
import threading
import uuid

import xxhash
from ckptflow.steps.checkpoint.tier import peer_retention
from ckptflow.steps.checkpoint.tier.peer_wire import (
    HAVE_BATCH,
    OPS,
    BadRequest,
    PeerError,
    Wire,
    check_src,
    check_token,
    discard,
    file_kind,
    hash_file,
    have_items,
    size_field,
    step_of,
)

from ckptflow.core import tier
from ckptflow.core.storage import Storage

log = logging.getLogger("ckptflow.tier.peers")

RESERVE_BYTES = 64 << 20  # free space a push must leave on the volume (local saves need room)
# requests per connection: a piece's objects, its `have` batches and its few other files
MAX_FILES_PER_CONNECTION = tier.MAX_OBJECTS + tier.MAX_OBJECTS // HAVE_BATCH + 16


class PeerServer:
    """The side channel's server of one rank: `address` is (host, port) to publish; `token`
    must be set (PeerDirectory.gather does it) before any request is served."""

    def __init__(
        self,
        run_dir: str,
        own_rank: int,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        keep: int = 2,
        timeout_s: float = 30.0,
        max_connections: int = 32,
        reserve_bytes: int = RESERVE_BYTES,
        max_requests: int = MAX_FILES_PER_CONNECTION,
    ):
        os.makedirs(run_dir, exist_ok=True)
        self.run_dir = os.path.realpath(run_dir)
        self.own_rank, self.keep, self.timeout_s = own_rank, keep, timeout_s
        self.reserve_bytes, self.max_requests = reserve_bytes, max_requests
        self.token: str | None = None
        self._slots = threading.BoundedSemaphore(max_connections)
        self._locks: dict[int, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._server = _TCPServer((host, port), _Handler, self)
        self.address = self._server.server_address[:2]
        self._thread = threading.Thread(
            target=lambda: self._server.serve_forever(poll_interval=0.1),
            name=f"ckptflow-peer-server-{own_rank}",
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving (connections in progress end at their next request)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=self.timeout_s)

    # -- paths ---------------------------------------------------------------------------------
    def rank_dir(self, src: int, create: bool) -> str:
        """<run_dir>/rank-<src>, checked to resolve inside run_dir (a symlink planted there
        must not redirect a write)."""
        path = os.path.join(self.run_dir, f"rank-{check_src(src)}")
        if create:
            os.makedirs(path, exist_ok=True)
        real = os.path.realpath(path)
        if os.path.dirname(real) != self.run_dir:
            raise BadRequest(f"{path} resolves outside {self.run_dir}")
        return real

    def target(self, src: int, rel: str, create: bool) -> str:
        root = self.rank_dir(src, create)
        path = os.path.join(root, rel)
        parent = os.path.dirname(path)
        if create:
            os.makedirs(parent, exist_ok=True)
        real = os.path.realpath(parent)
        if real != root and not real.startswith(root + os.sep):
            raise BadRequest(f"{rel!r} resolves outside {root}")
        return path

    def lock(self, src: int) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(src, threading.Lock())

    def check_space(self, size: int) -> None:
        st = os.statvfs(self.run_dir)
        free = st.f_bavail * st.f_frsize
        if size + self.reserve_bytes > free:
            raise BadRequest(f"{self.run_dir}: {size} bytes do not fit ({free} free)")


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False

    def __init__(self, address, handler, peer: PeerServer):
        self.peer = peer
        if ":" in address[0]:  # a pod IP of an IPv6 cluster
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        # bounded threads: a flood of connections is closed at once, never queued in memory
        if not self.peer._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.peer._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.peer._slots.release()


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        peer: PeerServer = self.server.peer
        # a reply's small header then its body: without this, Nagle holds the body until the
        # header's delayed ACK (40 ms per file fetched)
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        wire = Wire(self.request, f"peer {self.client_address[0]}", peer.timeout_s)
        served = 0
        try:
            while served < peer.max_requests and not wire.recv_eof():
                served += 1
                header = wire.recv_header()
                if not check_token(header.get("token"), peer.token):
                    raise BadRequest("refused: not this run's token")
                if header.get("op") not in OPS:
                    raise BadRequest(f"unknown op {str(header.get('op'))[:20]!r}")
                src = check_src(header.get("src"))
                getattr(self, f"_{header['op']}")(peer, wire, header, src)
        except BadRequest as exc:
            log.warning("peer server: refused a request from %s: %s", self.client_address[0], exc)
            with contextlib.suppress(PeerError, OSError):
                wire.send_header({"ok": False, "error": str(exc)[:500]})
        except (PeerError, OSError) as exc:  # the peer went away or stalled: its problem
            log.debug("peer server: connection from %s ended: %s", self.client_address[0], exc)

    def _have(self, peer: PeerServer, wire: Wire, header: dict, src: int) -> None:
        root = peer.rank_dir(src, create=False)
        found = []
        for key, size in have_items(header):
            with contextlib.suppress(OSError):
                if os.stat(os.path.join(root, "objects", key[:2], key)).st_size == size:
                    found.append(key)
        wire.send_header({"ok": True, "have": found})

    def _put(self, peer: PeerServer, wire: Wire, header: dict, src: int) -> None:
        if src == peer.own_rank:
            raise BadRequest(f"rank {src}'s own folder takes no pushes")
        rel = header.get("path")
        kind, limit = file_kind(rel, src)
        size = size_field(header, limit)
        peer.check_space(size)
        path = peer.target(src, rel, create=True)
        tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{_tmp_id()}.tmp")
        problem = None
        try:
            digest = _receive(wire, tmp, size, kind)
            if kind == "object" and digest != os.path.basename(path):
                problem = f"{rel}: bytes do not match the key"
            elif kind == "piece":
                with peer.lock(src):
                    problem = _piece_problem(peer, src, rel, tmp)
                    if not problem:
                        os.replace(tmp, path)
                        tmp = None
                        peer_retention.prune_replicas(peer.rank_dir(src, False), src, peer.keep)
            else:
                os.replace(tmp, path)
                tmp = None
        finally:
            # removed before the reply: a pusher that hears "refused" finds nothing left
            discard(tmp)
        wire.send_header({"ok": False, "error": problem} if problem else {"ok": True})

    def _get(self, peer: PeerServer, wire: Wire, header: dict, src: int) -> None:
        rel = header.get("path")
        _, limit = file_kind(rel, src)
        path = peer.target(src, rel, create=False)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            wire.send_header({"ok": False, "missing": True, "error": f"rank-{src}/{rel}: absent"})
            return
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(fd).st_size
            if size > limit or not os.path.isfile(path):
                raise BadRequest(f"rank-{src}/{rel}: not a file of at most {limit} bytes")
            wire.send_header({"ok": True, "size": size})
            wire.sock.settimeout(peer.timeout_s)
            sent = wire.sock.sendfile(f, 0, size)
            if sent != size:  # the file shrank under us: the peer sees a short body
                raise PeerError(f"rank-{src}/{rel}: sent {sent} of {size} bytes")

    def _damaged(self, peer: PeerServer, wire: Wire, header: dict, src: int) -> None:
        rel = header.get("path")
        kind, _ = file_kind(rel, src)
        removed = False
        if kind == "object":
            path = peer.target(src, rel, create=False)
            key = os.path.basename(path)
            with contextlib.suppress(FileNotFoundError):
                if hash_file(path) != key:
                    os.remove(path)  # the pieces that list it are incomplete from now on
                    removed = True
                    log.warning("peer server: removed damaged object %s (a fetch found it)", path)
        wire.send_header({"ok": True, "removed": removed})


def _tmp_id() -> str:
    return uuid.uuid4().hex[:12]  # matches localfs.is_temporary: listings skip it


def _receive(wire: Wire, tmp: str, size: int, kind: str) -> str | None:
    """Stream `size` body bytes into the new file `tmp`; an object's xxh3-128 (else None)."""
    h = xxhash.xxh3_128() if kind == "object" else None
    buf = bytearray(min(size, 8 << 20) or 1)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        left = size
        while left:
            view = memoryview(buf)[: min(left, len(buf))]
            wire.recv_into(view)
            if h is not None:
                h.update(view)
            while view:
                view = view[os.write(fd, view) :]
            left -= min(left, len(buf))
    finally:
        os.close(fd)
    return h.hexdigest() if h is not None else None


def _piece_problem(peer: PeerServer, src: int, rel: str, tmp: str) -> str | None:
    """Why the PIECE in `tmp` must not be put in place (None when its piece is complete in
    rank-<src>: it parses, is src's at the step of its name, and its marker, manifest,
    COMMIT and objects are there; objects were hashed as they arrived)."""
    root = peer.rank_dir(src, create=False)
    with open(tmp, "rb") as f:
        blob = f.read(tier.MAX_PIECE_BYTES + 1)
    try:
        piece = tier.parse_piece(blob, f"rank-{src}/{rel}", root)
    except tier.PieceError as exc:
        return str(exc)
    if (piece.rank, piece.step) != (src, step_of(rel)):
        return f"rank-{src}/{rel}: the PIECE is rank {piece.rank}'s of step {piece.step}"
    return tier.verify_piece(Storage(root), piece, check_hash=False)


def default_host(pod_ip: str | None) -> str:
    """The address to bind: the pod's IP when the template gives it, else loopback (a plain
    local run: every rank on this host)."""
    return pod_ip or "127.0.0.1"


def hostname_of(host: str) -> str:
    """`host` as published: a bind-all address is no peer's way in (use the host's name)."""
    return socket.gethostname() if host in ("0.0.0.0", "::", "") else host

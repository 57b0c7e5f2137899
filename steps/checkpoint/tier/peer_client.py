"""The client end of the peer side channel: one connection to one peer's server (peer_server).

Every operation has the connection's timeout (peer_wire.Wire); a peer that cannot be
reached raises PeerError at once, one that does not answer PeerTimeout after `timeout_s`.
Received files are written to a hidden temporary name and renamed, an object only when its
bytes hash to its key (DamagedReplica naming the peer's file otherwise).
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid

import xxhash
from ckptflow.steps.checkpoint.tier.peer_wire import (
    HAVE_BATCH,
    BadRequest,
    DamagedReplica,
    PeerError,
    PeerTimeout,
    Wire,
    discard,
    file_kind,
    size_field,
)


class PeerClient:
    """A connection to the peer server at (host, port), authenticated with `token`."""

    def __init__(self, host: str, port: int, token: str, timeout_s: float = 30.0):
        self.what, self.token = f"{host}:{port}", token
        try:
            sock = socket.create_connection((host, port), timeout=timeout_s)
        except TimeoutError:
            raise PeerTimeout(f"{self.what}: no connection within {timeout_s:g} s") from None
        except OSError as exc:
            raise PeerError(f"{self.what}: unreachable ({exc.strerror or exc})") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.wire = Wire(sock, self.what, timeout_s)

    def __enter__(self) -> PeerClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.wire.sock.close()

    def url(self, src: int, rel: str) -> str:
        """How a file of a peer is named in messages."""
        return f"peer {self.what} rank-{src}/{rel}"

    def _send(self, header: dict) -> None:
        self.wire.send_header({**header, "token": self.token})

    def _reply(self, what: str) -> dict:
        reply = self.wire.recv_header()
        if reply.get("ok") is not True:
            error = str(reply.get("error") or "refused")[:500]
            raise (FileNotFoundError if reply.get("missing") else PeerError)(f"{what}: {error}")
        return reply

    def have(self, src: int, objects: dict[str, int]) -> set[str]:
        """The keys of `objects` (key -> size) the peer holds for rank `src` with that size."""
        items = sorted(objects.items())
        held: set[str] = set()
        for i in range(0, len(items), HAVE_BATCH):
            batch = [[k, s] for k, s in items[i : i + HAVE_BATCH]]
            self._send({"op": "have", "src": src, "keys": batch})
            reply = self._reply(self.url(src, "objects"))
            found = reply.get("have")
            if not isinstance(found, list):
                raise BadRequest(f"{self.what}: `have` reply without a key list")
            held.update(k for k in found if isinstance(k, str) and k in objects)
        return held

    def put_file(self, src: int, rel: str, path: str) -> int:
        """Push the local file `path` as rank `src`'s `rel`; the bytes sent."""
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            self._send({"op": "put", "src": src, "path": rel, "size": size})
            try:
                sent = self.wire.sock.sendfile(f, 0, size) if size else 0
            except TimeoutError:
                raise PeerTimeout(f"{self.url(src, rel)}: not taking data") from None
            except OSError as exc:  # the peer refused and closed: its reason is in the reply
                self._refused_reason(src, rel, exc)
            if sent != size:
                raise PeerError(f"{path}: changed while pushed ({sent} of {size} bytes)")
        self._reply(self.url(src, rel))
        return size

    def _refused_reason(self, src: int, rel: str, exc: OSError):
        try:
            self._reply(self.url(src, rel))
        except (PeerError, OSError) as reason:
            raise PeerError(str(reason)) from None
        raise PeerError(f"{self.url(src, rel)}: connection lost ({exc})") from None

    def get_bytes(self, src: int, rel: str) -> bytes:
        """A small file of the peer (marker, COMMIT, PIECE), bounded by its kind's limit;
        FileNotFoundError when the peer has none."""
        _, limit = file_kind(rel, src)
        self._send({"op": "get", "src": src, "path": rel})
        size = size_field(self._reply(self.url(src, rel)), min(limit, 64 << 20))
        return self.wire.recv_exact(size)

    def get_file(self, src: int, rel: str, path: str) -> int:
        """Fetch rank `src`'s `rel` into the local file `path` (temporary name, renamed);
        an object is hashed as it arrives and kept only when it matches its key (else
        DamagedReplica naming the peer's file; the server is told so it can drop its copy).
        The bytes received; FileNotFoundError when the peer has no such file."""
        kind, limit = file_kind(rel, src)
        self._send({"op": "get", "src": src, "path": rel})
        size = size_field(self._reply(self.url(src, rel)), limit)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = os.path.join(
            os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp"
        )
        h = xxhash.xxh3_128() if kind == "object" else None
        try:
            self._receive(tmp, size, h)
            if h is not None and h.hexdigest() != os.path.basename(rel):
                url = self.url(src, rel)
                self.report_damaged(src, rel)
                raise DamagedReplica(f"{url}: checksum does not match its key", [url])
            os.replace(tmp, path)
            tmp = None
        finally:
            discard(tmp)
        return size

    def _receive(self, tmp: str, size: int, h) -> None:
        buf = bytearray(min(size, 8 << 20) or 1)
        with open(tmp, "xb") as f:
            left = size
            while left:
                view = memoryview(buf)[: min(left, len(buf))]
                self.wire.recv_into(view)
                if h is not None:
                    h.update(view)
                f.write(view)
                left -= len(view)

    def report_damaged(self, src: int, rel: str) -> None:
        """Tell the peer its copy of an object is damaged (it checks for itself and removes
        it); best effort: a peer that no longer answers is left alone."""
        with contextlib.suppress(PeerError, OSError):
            self._send({"op": "damaged", "src": src, "path": rel})
            self._reply(self.url(src, rel))

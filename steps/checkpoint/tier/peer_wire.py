"""The peer side channel's wire format: bounded frames, the names a peer may ask for, the token.

A request or a reply is one frame: 4 bytes (big-endian length of a JSON header, at most
MAX_HEADER), the header (parsed by ckptflow.core.jsonfile: bounded size, depth and integer
digits), then `size` body bytes when the header says so. Every request carries the run's token
(rank 0 makes it, the gang shares it at start); a peer compares it in constant time and drops
the connection on any other.

A request names a file of a rank root under the run's folder as (src, path): `src` a saved
rank, `path` one of the names a piece is made of (the root marker, objects/<k[:2]>/<k>,
step-<S>/manifest-<id>.json, step-<S>/COMMIT, step-<S>/PIECE-<src>.json). Anything else is
refused before a byte is written or read, so no request can reach outside
<local_dir>/<run_key>/rank-<src>/: the names are matched whole against patterns whose
characters cannot form a path separator or `..`.

Every socket operation has a deadline: recv_exact and send_all give up after `timeout_s`
without progress, so a peer that stops answering costs seconds, never a hang.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import re
import socket
import struct
import time

import xxhash

from ckptflow.core import jsonfile, layout, tier
from ckptflow.core.errors import CorruptCheckpoint

MAX_HEADER = 256 << 10  # bytes of a header: a `have` batch of HAVE_BATCH keys fits easily
MAX_HEADER_DEPTH = 4  # {"keys": [[key, size], ...]} is 3 levels deep
HAVE_BATCH = 2048  # object keys asked for per `have` request (~100 KiB of header)
MAX_SMALL_FILE = 1 << 20  # a root marker or COMMIT: a few hundred bytes in practice
MAX_MANIFEST = 4 << 30  # a gang's manifest: 95 MiB at 64 ranks of a 300B model (docs)
CHUNK = 1 << 20  # bytes per send or receive of a body
OPS = ("have", "put", "get", "damaged")
_LEN = struct.Struct(">I")
_STEP_FILE_RE = re.compile(
    r"^(step-\d{8,19})/(COMMIT|manifest-[0-9a-f]{8,32}\.json|PIECE-(\d{1,7})\.json)$"
)
_OBJECT_RE = re.compile(r"^objects/([0-9a-f]{2})/([0-9a-f]{32})$")


class PeerError(Exception):
    """A peer could not be reached, refused a request or broke the protocol (the message
    names the peer and the file)."""


class PeerTimeout(PeerError):
    """A peer did not answer (or take our bytes) within the timeout."""


class BadRequest(PeerError):
    """A request (or a reply) that breaks the protocol: a wrong token, a hostile header, a
    name outside a piece, a size over its bound."""


class DamagedReplica(PeerError, CorruptCheckpoint):
    """A file a peer sent does not match its key or the PIECE (the message names the file)."""

    def __init__(self, message: str, files: list[str] | None = None):
        CorruptCheckpoint.__init__(self, message, files)


def check_token(given, expected: str | None) -> bool:
    """True when `given` is the run's token (constant time; False while none is set)."""
    if not expected or not isinstance(given, str) or len(given) > 256:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def check_src(src) -> int:
    """A saved rank named by a request (its folder rank-<src>)."""
    if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < tier.MAX_RANK:
        raise BadRequest(f"src must be a rank in [0, {tier.MAX_RANK}), got {str(src)[:40]!r}")
    return src


def file_kind(path, src: int) -> tuple[str, int]:
    """(kind, the most bytes it may have) of a name a request gives, relative to rank-<src>:
    kind is "marker", "object", "manifest", "commit" or "piece". BadRequest for any other name
    (absolute, `..`, another rank's PIECE, a step number over layout.MAX_STEP)."""
    if not isinstance(path, str) or len(path) > 200:
        raise BadRequest(f"invalid file name {str(path)[:60]!r}")
    if path == layout.ROOT_MARKER:
        return "marker", MAX_SMALL_FILE
    if m := _OBJECT_RE.match(path):
        if m.group(1) != m.group(2)[:2]:
            raise BadRequest(f"object {path!r} is not in its prefix folder")
        return "object", tier.MAX_OBJECT_BYTES
    m = _STEP_FILE_RE.match(path)
    if not m or layout.parse_step_dir(m.group(1)) > layout.MAX_STEP:
        raise BadRequest(f"{path[:60]!r} is not a file of a piece")
    name = m.group(2)
    if name == layout.COMMIT:
        return "commit", MAX_SMALL_FILE
    if name.startswith("manifest-"):
        return "manifest", MAX_MANIFEST
    if int(m.group(3)) != src:
        raise BadRequest(f"{path!r} is not rank {src}'s PIECE")
    return "piece", tier.MAX_PIECE_BYTES


def hash_file(path: str) -> str:
    """The xxh3-128 of a local file (its object key when intact), read in bounded blocks."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while block := f.read(tier.HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


def discard(tmp: str | None) -> None:
    """Remove a received body's temporary file that was not renamed into place (None: it
    was): a refused or torn transfer leaves nothing a reader could take for a file."""
    if tmp is not None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def step_of(path: str) -> int | None:
    """The step of a step file's name (None for the marker and objects)."""
    m = _STEP_FILE_RE.match(path)
    return layout.parse_step_dir(m.group(1)) if m else None


class Wire:
    """One connection's framing with a deadline on every operation; `what` names the peer in
    errors (host:port)."""

    def __init__(self, sock: socket.socket, what: str, timeout_s: float):
        self.sock, self.what, self.timeout_s = sock, what, timeout_s
        sock.settimeout(timeout_s)

    def _deadline(self, n: int) -> float:
        # a body may take longer than one timeout, but never stall for one: at least 1 MiB/s
        return time.monotonic() + self.timeout_s + n / (1 << 20)

    def recv_exact(self, n: int) -> bytes:
        buf = bytearray(n)
        self.recv_into(memoryview(buf))
        return bytes(buf)

    def recv_into(self, view: memoryview) -> None:
        """Fill `view` from the socket; PeerError when the peer closes, PeerTimeout after
        `timeout_s` without a byte or past the whole read's deadline."""
        deadline, got = self._deadline(len(view)), 0
        while got < len(view):
            left = deadline - time.monotonic()
            if left <= 0:
                raise PeerTimeout(f"{self.what}: no answer within {self.timeout_s:g} s")
            self.sock.settimeout(min(self.timeout_s, left))
            try:
                n = self.sock.recv_into(view[got:], min(CHUNK, len(view) - got))
            except TimeoutError:
                raise PeerTimeout(f"{self.what}: no answer within {self.timeout_s:g} s") from None
            if n == 0:
                raise PeerError(f"{self.what}: connection closed mid-frame")
            got += n

    def send_all(self, data) -> None:
        view = memoryview(data).cast("B")
        deadline = self._deadline(len(view))
        while view:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PeerTimeout(f"{self.what}: not taking data within {self.timeout_s:g} s")
            self.sock.settimeout(min(self.timeout_s, left))
            try:
                n = self.sock.send(view[:CHUNK])
            except TimeoutError:
                raise PeerTimeout(
                    f"{self.what}: not taking data within {self.timeout_s:g} s"
                ) from None
            view = view[n:]

    def send_header(self, header: dict) -> None:
        blob = json.dumps(header, separators=(",", ":")).encode()
        if len(blob) > MAX_HEADER:
            raise BadRequest(f"{self.what}: header of {len(blob)} bytes (at most {MAX_HEADER})")
        self.send_all(_LEN.pack(len(blob)) + blob)

    def recv_header(self) -> dict:
        """The next frame's header, bounded and parsed; BadRequest when it is hostile."""
        (n,) = _LEN.unpack(self.recv_exact(_LEN.size))
        if n > MAX_HEADER:
            raise BadRequest(f"{self.what}: header of {n} bytes (at most {MAX_HEADER})")
        blob = self.recv_exact(n)
        try:
            doc = jsonfile.loads(
                blob, what=f"{self.what} header", max_bytes=MAX_HEADER, max_depth=MAX_HEADER_DEPTH
            )
        except CorruptCheckpoint as exc:
            raise BadRequest(str(exc)) from None
        if not isinstance(doc, dict):
            raise BadRequest(f"{self.what}: header is not a JSON object")
        return doc

    def recv_eof(self) -> bool:
        """True when the peer closed the connection cleanly before a new frame (idle
        connections are closed after `timeout_s`)."""
        try:
            self.sock.settimeout(self.timeout_s)
            first = self.sock.recv(1, socket.MSG_PEEK)
        except (TimeoutError, OSError):
            return True
        return first == b""


def size_field(header: dict, limit: int) -> int:
    """A header's `size`: an integer in [0, limit] (BadRequest otherwise)."""
    size = header.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= limit:
        raise BadRequest(f"size must be an integer in [0, {limit}], got {str(size)[:40]!r}")
    return size


def have_items(header: dict) -> list[tuple[str, int]]:
    """A `have` request's [[key, size], ...] (at most HAVE_BATCH, every key and size valid)."""
    keys = header.get("keys")
    if not isinstance(keys, list) or len(keys) > HAVE_BATCH:
        raise BadRequest(f"keys must be a list of at most {HAVE_BATCH} [key, size] pairs")
    out = []
    for item in keys:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
            raise BadRequest("keys must be [key, size] pairs")
        key, size = item
        if not layout.KEY_RE.match(key):
            raise BadRequest(f"invalid object key {key[:40]!r}")
        if isinstance(size, bool) or not isinstance(size, int):
            raise BadRequest(f"invalid size for {key}")
        if not 0 <= size <= tier.MAX_OBJECT_BYTES:
            raise BadRequest(f"invalid size for {key}")
        out.append((key, size))
    return out

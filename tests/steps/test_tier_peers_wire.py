"""The peer server against hostile input (issue 35): headers too large, too deep or not JSON,
names outside a piece, sizes over their bounds or the volume, bytes that do not match their
key, a planted symlink, a flood of connections. Every write is confined to a tmp_path sandbox."""

from __future__ import annotations

import json
import os
import socket
import struct

import pytest
from ckptflow.steps.checkpoint.tier.peer_server import PeerServer
from ckptflow.steps.checkpoint.tier.peer_wire import MAX_HEADER, BadRequest, file_kind

from ckptflow.core import layout

TOKEN = "ab" * 16
KEY = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def server(tmp_path):
    """Rank 1's server over tmp_path/sandbox/run (nothing else on the host is reachable)."""
    run = tmp_path / "sandbox" / "run"
    srv = PeerServer(str(run), 1, host="127.0.0.1", keep=2, timeout_s=2, max_connections=4)
    srv.token = TOKEN
    yield srv, run
    srv.close()


def connect(srv) -> socket.socket:
    s = socket.create_connection(srv.address, timeout=5)
    s.settimeout(5)
    return s


def frame(header, body: bytes = b"") -> bytes:
    blob = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack(">I", len(blob)) + blob + body


def reply(s: socket.socket) -> dict | None:
    """The server's reply header, or None when it closed the connection without one."""
    head = b""
    while len(head) < 4:
        chunk = s.recv(4 - len(head))
        if not chunk:
            return None
        head += chunk
    (n,) = struct.unpack(">I", head)
    blob = b""
    while len(blob) < n:
        blob += s.recv(n - len(blob))
    return json.loads(blob)


def closed(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def files_under(path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def put(path: str, body: bytes, *, src: int = 0, size: int | None = None, token: str = TOKEN):
    n = len(body) if size is None else size
    return frame({"op": "put", "token": token, "src": src, "path": path, "size": n}, body)


@pytest.mark.parametrize(
    "name",
    [
        "../x",
        "/etc/passwd",
        "objects/01/../../../x",
        f"objects/ff/{KEY}",  # not its prefix folder
        f"objects/01/{KEY}/x",
        "objects/01/0123",
        "step-00000001/../../x",
        "step-1/COMMIT",  # fewer than 8 digits
        "step-99999999999999999999/COMMIT",  # over layout.MAX_STEP
        "step-00000001/PIECE-1.json",  # another rank's PIECE under rank 0
        "step-00000001/other.json",
        "step-00000001/manifest-x.json",
        "ckptflow-root.json/x",
        "",
        None,
        7,
        "x" * 300,
    ],
)
def test_names_outside_a_piece_are_refused(name):
    with pytest.raises(BadRequest):
        file_kind(name, 0)


def test_names_of_a_piece_are_accepted():
    assert file_kind(layout.ROOT_MARKER, 0)[0] == "marker"
    assert file_kind(f"objects/01/{KEY}", 0)[0] == "object"
    assert file_kind("step-00000007/COMMIT", 0)[0] == "commit"
    assert file_kind("step-00000007/manifest-0123abcd.json", 0)[0] == "manifest"
    assert file_kind("step-00000007/PIECE-3.json", 3) == ("piece", 16 << 20)


@pytest.mark.parametrize("name", ["../escaped", "/etc/escaped", "step-00000001/../../escaped"])
def test_a_put_outside_the_run_writes_nothing(server, tmp_path, name):
    srv, run = server
    with connect(srv) as s:
        s.sendall(put(name, b"hostile"))
        answer = reply(s)
        assert answer["ok"] is False and "not a file of a piece" in answer["error"]
        assert closed(s)
    assert files_under(tmp_path) == []


@pytest.mark.parametrize(
    "header, why",
    [
        (
            {
                "op": "put",
                "token": TOKEN,
                "src": 0,
                "path": "step-00000001/COMMIT",
                "size": 2 << 20,
            },
            "size",
        ),
        ({"op": "put", "token": TOKEN, "src": 0, "path": layout.ROOT_MARKER, "size": -1}, "size"),
        ({"op": "put", "token": TOKEN, "src": 0, "path": layout.ROOT_MARKER, "size": True}, "size"),
        (
            {"op": "put", "token": TOKEN, "src": 0, "path": f"objects/01/{KEY}", "size": 1 << 60},
            "size",
        ),
        (
            {"op": "put", "token": TOKEN, "src": 0, "path": f"objects/01/{KEY}", "size": 1 << 43},
            "fit",
        ),
        ({"op": "put", "token": TOKEN, "src": True, "path": layout.ROOT_MARKER, "size": 1}, "src"),
        (
            {"op": "put", "token": TOKEN, "src": 1 << 40, "path": layout.ROOT_MARKER, "size": 1},
            "src",
        ),
        (
            {"op": "put", "token": TOKEN, "src": 1, "path": layout.ROOT_MARKER, "size": 1},
            "own folder",
        ),
        ({"op": "rm", "token": TOKEN, "src": 0, "path": layout.ROOT_MARKER}, "unknown op"),
        ({"op": "have", "token": TOKEN, "src": 0, "keys": [[KEY, 1]] * 5000}, "at most"),
        ({"op": "have", "token": TOKEN, "src": 0, "keys": [["../x", 1]]}, "invalid object key"),
        (
            {"op": "put", "token": "x" * 5000, "src": 0, "path": layout.ROOT_MARKER, "size": 1},
            "token",
        ),
        ({"op": "put", "token": None, "src": 0, "path": layout.ROOT_MARKER, "size": 1}, "token"),
        ([1, 2], "not a JSON object"),
        (b"\xff\xfe not json", "not JSON"),
        (b"[" * 100 + b"]" * 100, "deeper"),
        (b'{"size": ' + b"9" * 200 + b"}", "digits"),
    ],
)
def test_hostile_headers_are_refused(server, tmp_path, header, why):
    srv, run = server
    with connect(srv) as s:
        s.sendall(frame(header))
        answer = reply(s)
        assert answer["ok"] is False and why in answer["error"], answer
        assert closed(s)
    assert files_under(tmp_path) == []


def test_a_header_over_its_bound_is_refused_unread(server, tmp_path):
    srv, run = server
    with connect(srv) as s:
        s.sendall(struct.pack(">I", MAX_HEADER + 1))  # announces 256 KiB + 1: never read
        answer = reply(s)
        assert answer["ok"] is False and "header of" in answer["error"]
        assert closed(s)


def test_a_body_that_does_not_hash_to_its_key_is_not_kept(server, tmp_path):
    srv, run = server
    with connect(srv) as s:
        s.sendall(put(f"objects/01/{KEY}", b"not the bytes of that key"))
        answer = reply(s)
        assert answer["ok"] is False and "do not match the key" in answer["error"]
    assert files_under(tmp_path) == []  # nor its temporary file


def test_a_short_body_leaves_nothing(server, tmp_path):
    srv, run = server
    with connect(srv) as s:
        s.sendall(put(layout.ROOT_MARKER, b"{}", size=100))  # 98 bytes never come
        s.shutdown(socket.SHUT_WR)
        assert reply(s) is None  # closed: its handler removed the temporary file first
    assert files_under(tmp_path) == []


def test_a_planted_symlink_does_not_redirect_a_put(server, tmp_path):
    srv, run = server
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, run / "rank-0")
    with connect(srv) as s:
        s.sendall(put(layout.ROOT_MARKER, b"{}"))
        answer = reply(s)
        assert answer["ok"] is False and "outside" in answer["error"]
    assert list(outside.iterdir()) == []


def test_a_flood_of_connections_is_bounded(server):
    srv, run = server
    held = [connect(srv) for _ in range(4)]  # max_connections=4: each holds a handler
    try:
        with connect(srv) as extra:
            assert closed(extra)  # closed at once, never queued
    finally:
        for s in held:
            s.close()


def test_an_idle_connection_is_dropped_after_the_timeout(server):
    srv, run = server
    with connect(srv) as s:
        s.sendall(struct.pack(">I", 10) + b"{")  # a header that never completes
        assert reply(s) is None  # closed by the server after timeout_s (2 s), no hang


def test_requests_per_connection_are_bounded(tmp_path):
    srv = PeerServer(str(tmp_path / "run"), 1, host="127.0.0.1", timeout_s=2, max_requests=2)
    srv.token = TOKEN
    try:
        with connect(srv) as s:
            for _ in range(2):
                s.sendall(frame({"op": "have", "token": TOKEN, "src": 0, "keys": [[KEY, 1]]}))
                assert reply(s) == {"ok": True, "have": []}
            s.sendall(frame({"op": "have", "token": TOKEN, "src": 0, "keys": [[KEY, 1]]}))
            assert reply(s) is None  # the third: the connection is closed
    finally:
        srv.close()


def test_an_ipv6_address_is_served(tmp_path):
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    srv = PeerServer(str(tmp_path / "run"), 1, host="::1", timeout_s=2)
    srv.token = TOKEN
    try:
        with connect(srv) as s:
            s.sendall(frame({"op": "have", "token": TOKEN, "src": 0, "keys": []}))
            assert reply(s) == {"ok": True, "have": []}
    finally:
        srv.close()

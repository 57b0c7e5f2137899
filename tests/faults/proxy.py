"""A small fault-injecting HTTP proxy between an S3 client (s3fs/botocore) and the moto server.

Point AWS_ENDPOINT_URL at `FaultProxy(upstream).url`; every request is forwarded unchanged
unless a rule matches it. Rules inject what real object stores do under stress:

    "500"       InternalError, once per match                 (transient)
    "503"       SlowDown (throttling)                          (transient)
    "reset"     the connection is reset before any response    (transient)
    "lost"      forwarded, then reset: the request took effect but the reply never came
    "slow"      forwarded after `delay` seconds                (transient)
    "403"       AccessDenied                                   (permanent)
    "nobucket"  NoSuchBucket                                   (permanent)

`log` records (time, method, path, action) for every request, so a test can count retries and
the pauses between them.
"""

from __future__ import annotations

import http.client
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

_ERRORS = {
    "500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "503": (503, "SlowDown", "Please reduce your request rate."),
    "403": (403, "AccessDenied", "Access Denied"),
    "nobucket": (404, "NoSuchBucket", "The specified bucket does not exist"),
}
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}


@dataclass
class Rule:
    """Inject `action` into requests matching `method` and the `path` regex, `times` times
    (None: forever)."""

    action: str
    method: str | None = None
    path: str = ""
    times: int | None = 1
    delay: float = 0.0

    def matches(self, method: str, path: str) -> bool:
        if self.times is not None and self.times <= 0:
            return False
        return (self.method in (None, method)) and re.search(self.path, path) is not None


class FaultProxy:
    """A threaded HTTP/1.1 proxy in this process; `add(...)` rules, read `log`, `close()`."""

    def __init__(self, upstream: str):
        u = urlparse(upstream)
        self.upstream = (u.hostname, u.port)
        self.rules: list[Rule] = []
        self.log: list[tuple[float, str, str, str]] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def add(self, action: str, *, method=None, path="", times=1, delay=0.0) -> Rule:
        if action not in {*_ERRORS, "reset", "lost", "slow"}:
            raise ValueError(f"unknown action {action!r}")
        rule = Rule(action, method, path, times, delay)
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def pick(self, method: str, path: str) -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if rule.matches(method, path):
                    if rule.times is not None:
                        rule.times -= 1
                    return rule
        return None

    def record(self, method: str, path: str, action: str) -> None:
        with self._lock:
            self.log.append((time.monotonic(), method, path, action))

    def injected(self, action: str | None = None) -> list[tuple[float, str, str, str]]:
        return [e for e in self.log if e[3] != "forward" and action in (None, e[3])]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: FaultProxy

    def log_message(self, *args) -> None:  # quiet
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                chunk = self.rfile.read(size + 2)[:size]
                if size == 0:
                    return out
                out += chunk
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _handle(self) -> None:
        body = self._body()
        method, path = self.command, self.path
        rule = self.owner.pick(method, path)
        action = rule.action if rule else "forward"
        self.owner.record(method, path, action)
        if action in _ERRORS:
            self._error(*_ERRORS[action])
            return
        if action == "reset":
            self._reset()
            return
        if action == "slow":
            time.sleep(rule.delay)
        status, reason, headers, data = self._forward(method, path, body)
        if action == "lost":
            self._reset()
            return
        self.send_response(status, reason)
        for k, v in headers:
            if k.lower() not in _HOP and k.lower() != "content-length":
                self.send_header(k, v)
        length = next((v for k, v in headers if k.lower() == "content-length"), None)
        self.send_header(
            "Content-Length", length if method == "HEAD" and length else str(len(data))
        )
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(data)

    def _forward(self, method: str, path: str, body: bytes):
        conn = http.client.HTTPConnection(*self.owner.upstream, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            if body or method in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.reason, resp.getheaders(), data
        finally:
            conn.close()

    def _error(self, status: int, code: str, message: str) -> None:
        xml = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{message}</Message><RequestId>fault-proxy</RequestId></Error>"
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(xml)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(xml)

    def _reset(self) -> None:
        """Close with RST (SO_LINGER 0): the client sees 'connection reset by peer'."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

"""A small HTTP proxy in front of a storage emulator, for the tests of gs:// and az://.

It forwards every request to the emulator and can, on demand:
- fail the next matching requests with a transient status (503) before they reach the emulator,
  or after (the emulator did the work, the client only lost the reply: the case a retried
  conditional create must recognise as its own success);
- enforce GCS's `ifGenerationMatch=0` on uploads (412 when the object exists), which
  gcp-storage-emulator ignores: with it the GCS commit path is tested against a server that
  refuses a second create, the way Google Cloud Storage does. Conditional creates are
  serialized here, so two racing creates of one name see the first one's object.
Bound to 127.0.0.1 on a port the OS picks.
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


@dataclass
class Fault:
    """Fail the next `count` requests whose method is `method` and whose path contains `part`."""

    method: str
    part: str
    count: int = 1
    status: int = 503
    after_forward: bool = False  # True: forwarded first, only the reply is lost


class CloudProxy:
    def __init__(self, upstream: str, gcs_preconditions: bool = False):
        url = urllib.parse.urlsplit(upstream)
        self.upstream = (url.hostname, url.port)
        self.gcs_preconditions = gcs_preconditions
        self.faults: list[Fault] = []
        self.failed: list[str] = []  # "METHOD path" of each request failed on purpose
        self.seen: list[str] = []  # "METHOD path" of each request since the last fail()
        self.lock = threading.Lock()
        self.create_lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"proxy": self})
        self.server = _QuietServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> CloudProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def fail(self, *faults: Fault) -> None:
        with self.lock:
            self.faults = list(faults)
            self.failed, self.seen = [], []

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self.lock:
            self.seen.append(f"{method} {path}")
            for f in self.faults:
                if f.count > 0 and f.method == method and f.part in path:
                    f.count -= 1
                    self.failed.append(f"{method} {path}")
                    return f
        return None

    def forward(self, method: str, path: str, headers: dict, body: bytes):
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            # the client's Host header goes through: an upload URL the emulator hands back
            # then points at this proxy too
            conn.putrequest(method, path, skip_host="Host" in headers or "host" in headers)
            for k, v in headers.items():
                conn.putheader(k, v)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()

    def gcs_object_exists(self, path: str, body: bytes) -> bool:
        """Whether the object a GCS upload names is there (name in the query or, for a
        multipart upload, in the first part's JSON)."""
        url = urllib.parse.urlsplit(path)
        query = urllib.parse.parse_qs(url.query)
        bucket = url.path.split("/b/", 1)[1].split("/", 1)[0]
        name = (query.get("name") or [None])[0]
        if name is None:
            start = body.index(b"{")
            name = json.loads(body[start : body.index(b"\n", start)])["name"]
        quoted = urllib.parse.quote(name, safe="")
        status, _, _ = self.forward("GET", f"/storage/v1/b/{bucket}/o/{quoted}", {}, b"")
        return status == 200


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        """A client that hung up (a test done, a retry's abandoned attempt) is no error."""
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def _conditional_create(path: str) -> bool:
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
    return path.startswith("/upload/") and query.get("ifGenerationMatch") == ["0"]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    proxy: CloudProxy

    def log_message(self, *args):  # quiet
        pass

    def _handle(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        p = self.proxy
        fault = p.take_fault(self.command, self.path)
        if fault and not fault.after_forward:
            return self._reply(fault.status, [], b'{"error": {"code": 503, "message": "busy"}}')
        if p.gcs_preconditions and self.command == "POST" and _conditional_create(self.path):
            with p.create_lock:
                if p.gcs_object_exists(self.path, body):
                    error = {"error": {"code": 412, "message": "conditionNotMet"}}
                    return self._reply(412, [], json.dumps(error).encode())
                status, out_headers, out = p.forward(self.command, self.path, headers, body)
        else:
            status, out_headers, out = p.forward(self.command, self.path, headers, body)
        if fault:  # the work is done upstream; the client sees a failure
            return self._reply(fault.status, [], b'{"error": {"code": 503, "message": "lost"}}')
        self._reply(status, out_headers, out)

    def _reply(self, status: int, headers, body: bytes):
        self.send_response(status)
        for k, v in headers:
            if k.lower() not in HOP:
                self.send_header(k, v)
        if not any(k.lower() == "content-type" for k, _ in headers):
            self.send_header("Content-Type", "application/json")
        lengths = [v for k, v in headers if k.lower() == "content-length"]
        # a HEAD reply has no body but the length of the one a GET would send
        self.send_header(
            "Content-Length", lengths[0] if self.command == "HEAD" and lengths else str(len(body))
        )
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _handle

"""moto's S3 server in this process, counting the requests each client makes.

Clients are told apart by their access key id (moto accepts any): a rank that sets
AWS_ACCESS_KEY_ID to `rank_key(r)` has its requests counted under `r`. Used by
benchmarks/scale.py (requests per rank on load, against the number of ranks) and by the test
that a rank's requests on load do not grow with the world size
(tests/steps/test_checkpoint_scale.py).
"""

from __future__ import annotations

import re
import socket
import threading
from collections import Counter
from urllib.parse import parse_qs

_CRED = re.compile(r"Credential=([^/]+)/")
KEY_PREFIX = "ckptflow-rank-"


def rank_key(rank: int, phase: str = "run") -> str:
    """The access key id rank `rank` uses in `phase` (save, load), so its requests are
    counted as its own."""
    return f"{KEY_PREFIX}{phase}-{rank}"


def kind_of(method: str, path: str, query: str) -> str:
    """What a request is, for the counts: LIST, GET, HEAD, PUT, POST, DELETE."""
    q = parse_qs(query, keep_blank_values=True)
    bucket_only = path.strip("/").count("/") == 0
    if method == "GET" and (bucket_only or "list-type" in q or "prefix" in q):
        return "LIST"
    return method


class Counts:
    """Requests per client (access key id) and kind; `take()` returns and clears them."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by: dict[str, Counter] = {}
        self.log: list[tuple[str, str, str]] | None = None  # (client, kind, path) when a list

    def add(self, client: str, kind: str, path: str = "") -> None:
        with self._lock:
            self._by.setdefault(client, Counter())[kind] += 1
            if self.log is not None:
                self.log.append((client, kind, path))

    def take(self) -> dict[tuple[str, int], Counter]:
        """{(phase, rank): Counter(kind -> requests)} of the ranks' keys since the last take."""
        with self._lock:
            by, self._by = self._by, {}
        out = {}
        for key, c in by.items():
            if key.startswith(KEY_PREFIX):
                phase, rank = key[len(KEY_PREFIX) :].rsplit("-", 1)
                out[(phase, int(rank))] = c
        return out


def _counting(app, counts: Counts):
    def wrapped(environ, start_response):
        m = _CRED.search(environ.get("HTTP_AUTHORIZATION", ""))
        if m:
            kind = kind_of(
                environ.get("REQUEST_METHOD", ""),
                environ.get("PATH_INFO", ""),
                environ.get("QUERY_STRING", ""),
            )
            path = environ.get("PATH_INFO", "") + "?" + environ.get("QUERY_STRING", "")
            counts.add(m.group(1), kind, path)
        return app(environ, start_response)

    return wrapped


class CountingS3:
    """moto's S3 API on 127.0.0.1 (a free port) with per-client request counts (`counts`)."""

    def __init__(self):
        import logging

        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.counts = Counts()
        app = _counting(DomainDispatcherApplication(create_backend_app), self.counts)
        self._server = make_server("127.0.0.1", port, app, threaded=True)
        self.url = f"http://127.0.0.1:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def env(self) -> dict[str, str]:
        """The environment a client process points at this server with (fake credentials)."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": "ckptflow-setup",
            "AWS_SECRET_ACCESS_KEY": "testing-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def make_bucket(self, name: str) -> None:
        import boto3

        boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id="ckptflow-setup",
            aws_secret_access_key="testing-secret",
            region_name="us-east-1",
        ).create_bucket(Bucket=name)

    def close(self) -> None:
        self._server.shutdown()
        self._thread.join()

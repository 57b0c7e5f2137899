"""`python -m ckptflow.steps.rdzv`: the rendezvous store serves clients and names a taken port.

The full path (daemon + two torchrun ranks forming a group from the rendered manifest) is
tests/workflows/test_rendezvous.py.
"""

from __future__ import annotations

import socket
import threading
from datetime import timedelta

import pytest
from ckptflow.steps.rdzv import parse_args, serve

from ckptflow.contract import RdzvArgs


def test_store_serves_clients_until_stopped():
    from torch.distributed import TCPStore

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stop = threading.Event()
    server = threading.Thread(target=serve, args=(RdzvArgs(port=port), stop), daemon=True)
    server.start()
    client = None
    try:
        client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        client.set("rdzv", "joined")
        assert client.get("rdzv") == b"joined"
    finally:
        del client
        stop.set()
        server.join(timeout=30)
    assert not server.is_alive()


def test_taken_port_is_a_clear_error():
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit, match=f"cannot listen on 0.0.0.0:{port}"):
            serve(RdzvArgs(port=port), threading.Event())


def test_arguments():
    assert parse_args(["--port", "29411", "--timeout-seconds", "5"]) == RdzvArgs(
        port=29411, timeout_seconds=5.0
    )

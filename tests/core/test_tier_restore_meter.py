"""Storage.meter: bytes read from a root and the roots reached through it (issue 35: a
restore's bytes from object storage are counted where they arrive)."""

from __future__ import annotations

import numpy as np

from ckptflow.core import layout, locator
from ckptflow.core.storage import Storage


def _buf(n: int):
    return np.empty(n, dtype=np.uint8)


def test_reads_are_counted_on_the_root_and_its_child_and_peer_roots(tmp_path):
    st = Storage(str(tmp_path / "root"))
    st.write("a.json", b"x" * 100)
    other = tmp_path / "parent"
    Storage(str(other)).write("b", b"y" * 7)
    assert st.meter.bytes == 0
    assert st.read("a.json") == b"x" * 100
    assert st.read("a.json", limit=10) == b"x" * 10
    assert st.child("").read("a.json") and st.peer(str(other)).read("b") == b"y" * 7
    assert st.meter.bytes == 100 + 10 + 100 + 7
    assert Storage(str(other)).meter.bytes == 0  # a root opened on its own counts apart


def test_object_reads_into_buffers_count_what_was_read(tmp_path):
    for uri in (str(tmp_path / "disk"), "memory://meter-objects"):
        st = Storage(uri)
        data = b"z" * 4096
        key = "0" * 32
        st.write(layout.object_path(key), data)
        buf, n, _ = locator.read_object_into(st, key, [], len(data), _buf)
        assert n == len(data) and bytes(buf) == data
        # a size that differs reads nothing into a buffer and counts nothing more
        buf, _, _ = locator.read_object_into(st, key, [], 10, _buf)
        assert buf is None
        assert st.meter.bytes == len(data) + (11 if uri.startswith("memory") else 0)

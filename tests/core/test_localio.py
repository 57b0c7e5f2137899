"""Local-disk primitives: O_DIRECT writes (or their fallback), reads into caller buffers."""

from __future__ import annotations

import os

import numpy as np
import pytest

from ckptflow.core import localio


@pytest.mark.parametrize("n", [4096 * 3, 4096 * 3 + 17, (9 << 20) + 5])
@pytest.mark.parametrize("aligned", [True, False])
def test_direct_write_round_trips_or_declines_leaving_nothing(tmp_path, n, aligned):
    src = localio.aligned_empty(n + 1)
    src[:] = np.random.default_rng(n).integers(0, 256, n + 1, dtype=np.uint8)
    data = src[:n] if aligned else src[1:]
    path = str(tmp_path / "obj")
    if localio.write_direct(path, [data]):
        with open(path, "rb") as f:
            assert f.read() == data.tobytes()
    else:  # a filesystem without O_DIRECT (tmpfs): the caller writes it the ordinary way
        assert not os.path.exists(path)


def test_direct_write_declines_several_chunks_and_tiny_files(tmp_path):
    path = str(tmp_path / "obj")
    assert not localio.write_direct(path, [b"a" * 8192, b"b"])
    assert not localio.write_direct(path, b"small")
    assert not os.path.exists(path)


def test_read_into_allocates_nothing_when_the_size_differs(tmp_path):
    path = tmp_path / "obj"
    path.write_bytes(b"x" * 100)
    asked = []

    def get(n):
        asked.append(n)
        return np.empty(n, dtype=np.uint8)

    with open(path, "rb") as f:
        assert localio.read_into(f, 1 << 40, get) == (100, None)
    assert asked == []
    with open(path, "rb") as f:
        n, buf = localio.read_into(f, 100, get)
    assert n == 100 and buf.tobytes() == b"x" * 100


def test_scratch_buffers_are_aligned_reused_and_grown():
    a = localio.scratch("t", 1000)
    assert a.ctypes.data % localio.ALIGN == 0 and len(a) == 1000
    assert localio.scratch("t", 10).ctypes.data == a.ctypes.data
    assert len(localio.scratch("t", 1 << 20)) == 1 << 20


def test_sync_files_and_read_ahead_accept_a_fresh_file(tmp_path):
    p = tmp_path / "ab" / "obj"
    p.parent.mkdir()
    p.write_bytes(b"y" * 10)
    localio.sync_files([str(p)])
    localio.will_need(str(p))
    localio.will_need(str(tmp_path / "missing"))  # best effort: the real read reports it

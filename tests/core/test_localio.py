"""Local-disk primitives: O_DIRECT writes (or their fallback), reads into caller buffers."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(0, 3 * 4096 + 9), min_size=2, max_size=6))
def test_direct_write_of_several_chunks_round_trips(tmp_path_factory, lengths):
    """A compressed part is several buffers (zstd planes and raw planes): packed into aligned
    blocks through the bounce buffer, the tail written with O_DIRECT off."""
    rng = np.random.default_rng(sum(lengths))
    chunks = [rng.integers(0, 256, n, dtype=np.uint8) for n in lengths]
    path = str(tmp_path_factory.mktemp("direct") / "obj")
    expect = b"".join(c.tobytes() for c in chunks)
    if localio.write_direct(path, [*chunks[:-1], chunks[-1].tobytes()]):
        with open(path, "rb") as f:
            assert f.read() == expect
    else:  # declined only when too small, or where the filesystem refuses O_DIRECT
        assert len(expect) < localio.ALIGN or not _takes_direct(os.path.dirname(path))
        assert not os.path.exists(path)


def _takes_direct(folder: str) -> bool:
    probe = os.path.join(folder, "probe")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | getattr(os, "O_DIRECT", 0)))
    except OSError:
        return False
    os.unlink(probe)
    return hasattr(os, "O_DIRECT")


def test_direct_write_declines_tiny_files(tmp_path):
    path = str(tmp_path / "obj")
    assert not localio.write_direct(path, [b"a" * 100, b"b"])
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


def test_sync_files_accepts_a_fresh_file(tmp_path):
    p = tmp_path / "ab" / "obj"
    p.parent.mkdir()
    p.write_bytes(b"y" * 10)
    localio.sync_files([str(p)])

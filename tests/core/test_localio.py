"""Local-disk primitives: O_DIRECT writes (or their fallback), reads into caller buffers."""

from __future__ import annotations

import errno
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


def _cold_file(path, n: int) -> bytes:
    """A file of n random bytes on the disk, none of it in the page cache."""
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return data


def _is_cached(path) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        return localio.cached(fd)
    finally:
        os.close(fd)


def _destination(n: int, aligned: bool) -> np.ndarray:
    """n bytes of memory, on an ALIGN boundary or 64 bytes past one (as torch allocates)."""
    base = localio.aligned_empty(n + 64)
    return base[:n] if aligned else base[64 : 64 + n]


@pytest.mark.parametrize("extra", [0, 17, 2 * (1 << 20) + 4095])
@pytest.mark.parametrize("aligned", [True, False])
def test_a_cold_file_is_read_around_the_page_cache(tmp_path, extra, aligned):
    """A file not in the page cache is read with O_DIRECT (a cold GiB of 64 MiB objects here:
    0.54 s, against 1.0-1.5 s through the page cache), into any destination: an unaligned one
    (a torch tensor) through bounce blocks, tails shorter than a block included."""
    path, n = str(tmp_path / "obj"), localio.DIRECT_READ_MIN + extra
    data = _cold_file(path, n)
    assert not _is_cached(path)
    dst = _destination(n, aligned)
    with open(path, "rb") as f:
        got, buf = localio.read_into(f, n, lambda k: dst[:k], block=65536)
        assert not localio.is_direct(f.fileno())  # the caller's descriptor as it came
    assert got == n and buf is not None and buf.tobytes() == data
    assert not _is_cached(path)  # read around the cache: nothing was put into it


def test_a_cached_file_is_read_from_the_cache(tmp_path):
    """What is in the page cache already (read just before) is not read from the disk again."""
    path = str(tmp_path / "obj")
    data = _cold_file(path, localio.DIRECT_READ_MIN + 5)
    assert not _is_cached(path)
    with open(path, "rb") as f:
        f.read()
    assert _is_cached(path)
    dst = _destination(len(data), aligned=False)
    with open(path, "rb") as f:
        got, buf = localio.read_into(f, len(data), lambda k: dst[:k])
    assert got == len(data) and buf.tobytes() == data


def test_a_refused_direct_read_is_read_the_ordinary_way(tmp_path, monkeypatch):
    """A filesystem (or alignment) that refuses O_DIRECT reads with EINVAL is read through the
    page cache from the start; nothing the refused read left in the buffer survives."""
    path = str(tmp_path / "obj")
    data = _cold_file(path, localio.DIRECT_READ_MIN + 4096 * 3 + 1)
    real, refused = localio._pread, []

    def refusing(fd, view, offset):
        if localio.is_direct(fd):
            refused.append(offset)
            view[:8] = b"garbage!"
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, view, offset)

    monkeypatch.setattr(localio, "_pread", refusing)
    dst = _destination(len(data), aligned=True)
    with open(path, "rb") as f:
        got, buf = localio.read_into(f, len(data), lambda k: dst[:k], block=65536)
    assert refused == [0] and got == len(data) and buf.tobytes() == data


@pytest.mark.parametrize("cold", [True, False])
def test_a_file_that_shrinks_while_read_gives_no_buffer(tmp_path, cold):
    path = str(tmp_path / "obj")
    n = localio.DIRECT_READ_MIN + 4096
    _cold_file(path, n)
    if not cold:
        with open(path, "rb") as f:
            f.read()
    dst = _destination(n, aligned=False)

    def shrink_then_give(k):
        os.truncate(path, k // 2)
        return dst[:k]

    with open(path, "rb") as f:
        assert localio.read_into(f, n, shrink_then_give, block=65536) == (n // 2, None)


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


def test_a_read_into_a_caller_buffer_bounces_through_the_threads_read_buffer(tmp_path):
    """A thread reads one object at a time: a cold read into an unaligned caller buffer (a
    raw part into its tensor) bounces through the thread's object read buffer, not a second
    buffer beside it (a cold load held a 53 MiB read buffer and a 10 MiB bounce per thread)."""
    import threading

    path = str(tmp_path / "obj")
    data = _cold_file(path, localio.DIRECT_READ_MIN + 4096 * 5 + 3)
    dst = _destination(len(data), aligned=False)
    result = {}

    def in_a_fresh_thread():
        read_buf = localio.scratch(localio.READ_BUFFER, 4 << 20)  # an object read before
        before = set(localio._local.bufs)
        with open(path, "rb") as f:
            result["got"] = localio.read_into(f, len(data), lambda k: dst[:k], block=1 << 20)
        result["new"] = set(localio._local.bufs) - before
        result["same"] = localio.scratch(localio.READ_BUFFER, 1).ctypes.data == read_buf.ctypes.data

    t = threading.Thread(target=in_a_fresh_thread)
    t.start()
    t.join()
    got, buf = result["got"]
    assert got == len(data) and buf.tobytes() == data
    if _takes_direct(str(tmp_path)):
        assert result["new"] == set() and result["same"]


@pytest.mark.parametrize("offset", [0, 64])
def test_a_read_into_the_read_buffer_itself_is_not_bounced_over(tmp_path, offset):
    """The object read buffer as the destination (aligned, or a view 64 bytes in): its bytes
    survive, though bounce and tail would otherwise be carved from that same buffer."""
    path = str(tmp_path / "obj")
    data = _cold_file(path, localio.DIRECT_READ_MIN + 4096 * 2 + 17)
    n = len(data)
    own = localio.scratch(localio.READ_BUFFER, n + offset)[offset:]
    with open(path, "rb") as f:
        got, buf = localio.read_into(f, n, lambda k: own[:k], block=1 << 20)
    assert got == n and buf.tobytes() == data

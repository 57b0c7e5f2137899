"""Decoding stored bytes: every length the manifest declares is a hard bound on memory."""

from __future__ import annotations

import io
import tracemalloc

import numpy as np
import pytest
import zstandard

from ckptflow.core import codec


def zstd_bomb(size: int) -> bytes:
    """A zstd frame of `size` zero bytes, its size in the header: ~32 KiB for 1 GiB."""
    buf = io.BytesIO()
    w = zstandard.ZstdCompressor(level=1).stream_writer(buf, size=size, closefd=False)
    zeros = bytes(1 << 22)
    for _ in range(size >> 22):
        w.write(zeros)
    w.flush(zstandard.FLUSH_FRAME)
    return buf.getvalue()


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("width", [1, 4])
def test_a_frame_larger_than_declared_is_refused_before_allocating(width):
    bomb = zstd_bomb(1 << 30)
    planes = [["zstd", len(bomb)]] + [["raw", 4]] * (width - 1)
    stored = bomb + bytes(4 * (width - 1))

    def decode():
        with pytest.raises(ValueError, match="declares"):
            codec.decode(stored, planes, width, 4 * width)

    assert _peak(decode) < 1 << 20


def test_a_frame_that_does_not_declare_its_size_is_refused():
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(64))
    with pytest.raises(ValueError, match="declare"):
        codec.decode(frame, [["zstd", len(frame)]], 1, 64)


@pytest.mark.parametrize("width", [1, 2, 4])
def test_encode_decode_round_trip(width):
    raw = (np.random.default_rng(0).standard_normal(1 << 14) * 0.02).astype(np.float32)
    raw = raw.view(np.uint8)
    enc = codec.encode(raw, width, level=1)
    assert np.array_equal(codec.decode(enc.data, enc.planes, width, len(raw)), raw)
    out = np.empty(len(raw), dtype=np.uint8)
    codec.decode(enc.data, enc.planes, width, len(raw), out)
    assert np.array_equal(out, raw)

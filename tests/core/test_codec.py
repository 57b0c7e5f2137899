"""Decoding stored bytes: every length the manifest declares is a hard bound on memory."""

from __future__ import annotations

import io
import threading
import tracemalloc

import numpy as np
import pytest
import zstandard

from ckptflow.core import codec, localio


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


@pytest.mark.parametrize("width", [2, 4])
def test_a_compressed_part_is_stored_from_one_aligned_buffer(width):
    """Its planes are gathered (and the compressed ones' frames placed) into one aligned buffer
    in stored order: a local object then goes to the disk with O_DIRECT straight from it. As a
    list of planes, every byte went through the write's bounce buffer once more (0.28-0.33
    CPU-s per GiB, a quarter of the encoding)."""
    raw = (np.random.default_rng(1).standard_normal(1 << 16) * 0.02).astype(np.float32)
    raw = raw.view(np.uint8)
    enc = codec.encode(raw, width, level=1)
    assert "zstd" in [c for c, _ in enc.planes] and "raw" in [c for c, _ in enc.planes]
    (chunk,) = enc.chunks
    assert chunk.ctypes.data % localio.ALIGN == 0 and len(chunk) == enc.nbytes
    assert np.array_equal(codec.decode(enc.data, enc.planes, width, len(raw)), raw)


class _SampleOnlyCompressor:
    """Compresses a sample to nothing and a whole plane to more than its size."""

    def compress(self, data) -> bytes:
        n = len(memoryview(data))
        return b"\0" if n <= codec.SAMPLE_BYTES else bytes(n + 9)


def test_a_plane_whose_frame_would_not_be_smaller_is_stored_raw(monkeypatch):
    """A sample that compresses does not promise the whole plane does: a frame no smaller than
    its plane is not stored (the object never grows past the raw bytes, nor its buffer)."""
    monkeypatch.setattr(codec, "_compressor", lambda level: _SampleOnlyCompressor())
    raw = np.random.default_rng(2).integers(0, 256, 1 << 20, dtype=np.uint8)
    enc = codec.encode(raw, 1, level=1)
    assert enc.planes == [["raw", len(raw)]] and enc.nbytes == len(raw)
    assert np.array_equal(codec.decode(enc.data, enc.planes, 1, len(raw)), raw)


def _plain_decode(stored: bytes, planes: list, width: int, raw_size: int) -> np.ndarray:
    """The decoder of ckptflow before the tuned parameters (copied): zstd frames decoded by
    zstd's defaults, planes scattered into their columns."""
    out = np.empty(raw_size, dtype=np.uint8)
    columns = out.reshape(-1, len(planes))
    pos = 0
    for k, (c, length) in enumerate(planes):
        piece = stored[pos : pos + length]
        pos += length
        if c == "zstd":
            piece = zstandard.ZstdDecompressor().decompress(piece, max_output_size=raw_size)
        columns[:, k] = np.frombuffer(piece, dtype=np.uint8)
    return out


@pytest.mark.parametrize("dtype,width", [(np.float32, 4), (np.float16, 2)])
def test_tuned_frames_are_read_by_the_old_decoder_and_old_frames_by_the_new(dtype, width):
    raw = (np.random.default_rng(1).standard_normal(1 << 15) * 0.02).astype(dtype).view(np.uint8)
    enc = codec.encode(raw, width, level=codec.TUNED_LEVEL)
    assert "zstd" in [c for c, _ in enc.planes]
    assert np.array_equal(_plain_decode(enc.data, enc.planes, width, len(raw)), raw)
    # Frames of zstd's own level 1 (what earlier versions wrote) decode with today's decoder.
    old = codec.encode(raw, width, level=2)  # any level but the tuned one is zstd's own
    plain = zstandard.ZstdCompressor(level=1, write_content_size=True)
    chunks, planes, pos = [], [], 0
    for c, length in old.planes:
        chunk, pos = old.data[pos : pos + length], pos + length
        if c == "zstd":
            plane = zstandard.ZstdDecompressor().decompress(chunk)
            chunk = plain.compress(plane)
        chunks.append(bytes(chunk))
        planes.append([c, len(chunks[-1])])
    assert np.array_equal(codec.decode(b"".join(chunks), planes, width, len(raw)), raw)


def test_a_tuned_exponent_plane_is_smaller_than_at_zstd_level_1():
    raw = (np.random.default_rng(2).standard_normal(1 << 18) * 0.02).astype(np.float32)
    plane = np.ascontiguousarray(raw.view(np.uint8).reshape(-1, 4)[:, 3])
    tuned = codec._compressor(codec.TUNED_LEVEL).compress(plane.data)
    plain = zstandard.ZstdCompressor(level=1).compress(plane.data)
    assert len(tuned) <= len(plain)


def test_a_truncated_frame_is_refused():
    raw = np.frombuffer(bytes(range(256)) * 64, dtype=np.uint8)
    frame = codec._compressor(codec.TUNED_LEVEL).compress(raw.data)
    with pytest.raises((ValueError, zstandard.ZstdError)):
        codec.decode(frame[: len(frame) // 2], [["zstd", len(frame) // 2]], 1, len(raw))


def test_a_compressed_plane_is_decoded_a_block_at_a_time():
    """Each reader thread kept a scratch buffer of a whole plane (16 MiB for a 64 MiB fp32
    part) to decompress into before spreading it over its column: with four reads in flight,
    a cold load of 1 GiB held 0.225 GiB more than the state at its peak. Now a thread holds a
    block of words and a block of each compressed plane."""
    raw = (np.random.default_rng(5).standard_normal(1 << 22) * 0.02).astype(np.float32)
    raw = raw.view(np.uint8)  # 16 MiB: planes of 4 MiB
    enc = codec.encode(raw, 4, 1)
    assert "zstd" in [c for c, _ in enc.planes]
    stored, out = enc.data, np.empty(len(raw), dtype=np.uint8)
    got: list = []

    def decode():  # a thread of its own: no scratch buffer of another test's decode in it
        got.append(codec.decode(stored, enc.planes, 4, len(raw), out=out))

    def in_thread():
        t = threading.Thread(target=decode)
        t.start()
        t.join()

    blocks = codec.INFLATE_BLOCK + codec.INFLATE_BLOCK // 4  # the words and one plane's
    assert _peak(in_thread) < blocks + (64 << 10)
    assert got[0] is out and np.array_equal(out, raw)


def _strided_planes(raw: np.ndarray, width: int) -> np.ndarray:
    """Byte planes by numpy's strided column copy: what the encoder gathered before words."""
    return np.concatenate([raw.reshape(-1, width)[:, k] for k in range(width)])


@pytest.mark.parametrize("width", [2, 4, 8, 3])
@pytest.mark.parametrize("little", [True, False])
def test_planes_gathered_from_words_are_the_byte_columns(width, little, monkeypatch):
    """Shift-and-truncate gathering (by blocks of words) and the strided fallback of other
    hosts and widths give the same planes, across block boundaries and a short last block."""
    monkeypatch.setattr(codec, "GATHER_BLOCK", 1000)
    if not little:
        monkeypatch.setattr(codec, "_WORDS", {})
    raw = np.random.default_rng(width).integers(0, 256, width * 2500, dtype=np.uint8)
    out = np.full(len(raw), 7, dtype=np.uint8)
    codec.gather(raw, width, out)
    assert np.array_equal(out, _strided_planes(raw, width))


def test_a_raw_plane_after_a_compressed_one_moves_up_behind_its_frame():
    """Planes are gathered in place, so a raw plane that follows a frame is moved back over
    bytes of its own (low bytes constant, high bytes random: the reverse of a float)."""
    rng = np.random.default_rng(3)
    words = (rng.integers(0, 1 << 16, 1 << 16, dtype=np.uint32) << 16) | 0x0101
    raw = words.view(np.uint8)
    enc = codec.encode(raw, 4, level=1)
    assert [c for c, _ in enc.planes] == ["zstd", "zstd", "raw", "raw"]
    expected = _strided_planes(raw, 4)[len(raw) // 2 :]
    assert np.array_equal(enc.chunks[0][-len(raw) // 2 :], expected)
    assert np.array_equal(codec.decode(enc.data, enc.planes, 4, len(raw)), raw)


def test_an_encoding_thread_holds_no_buffer_but_its_gather_buffer():
    """Every plane is gathered into the gather buffer and compressed from there: a second
    buffer of a whole plane (16 MiB per writer thread for a 64 MiB fp32 part) is not kept."""
    raw = (np.random.default_rng(6).standard_normal(1 << 22) * 0.02).astype(np.float32)
    raw = raw.view(np.uint8)  # 16 MiB: planes of 4 MiB
    got: list = []

    def in_thread():  # a thread of its own: its scratch buffers are allocated in it
        t = threading.Thread(target=lambda: got.append(codec.encode(raw, 4, level=1)))
        t.start()
        t.join()

    frames = len(raw) // 4  # at most one plane's frame alive beside the buffer
    assert _peak(in_thread) < len(raw) + frames + (1 << 20)
    enc = got[0]
    assert np.array_equal(codec.decode(enc.data, enc.planes, 4, len(raw)), raw)


@pytest.mark.parametrize("width", [2, 4, 8])
@pytest.mark.parametrize("little", [True, False])
def test_planes_interleave_back_block_by_block(width, little, monkeypatch):
    """Raw and compressed planes are read in step, a block at a time, and interleaved into the
    output by words (or by strided columns on other hosts), across block boundaries and a
    short last block."""
    monkeypatch.setattr(codec, "INFLATE_BLOCK", 4096)
    if not little:
        monkeypatch.setattr(codec, "_WORDS", {})
    values = np.random.default_rng(width).standard_normal(5000) * 0.02
    raw = values.astype({2: np.float16, 4: np.float32, 8: np.float64}[width]).view(np.uint8)
    enc = codec.encode(raw, width, level=1)
    assert {"zstd", "raw"} <= {c for c, _ in enc.planes}
    out = np.full(len(raw), 7, dtype=np.uint8)
    assert codec.decode(enc.data, enc.planes, width, len(raw), out) is out
    assert np.array_equal(out, raw)


def test_a_frame_cut_short_in_a_later_block_is_refused():
    """A frame whose stored bytes end early fails the decode in the block where it ends."""
    raw = (np.random.default_rng(8).standard_normal(1 << 20) * 0.02).astype(np.float32)
    raw = raw.view(np.uint8)
    enc = codec.encode(raw, 4, level=1)
    assert [c for c, _ in enc.planes][-1] == "zstd"
    cut = enc.planes[:-1] + [["zstd", enc.planes[-1][1] // 2]]
    stored = enc.data[: sum(n for _, n in cut)]
    with pytest.raises((ValueError, zstandard.ZstdError)):
        codec.decode(stored, cut, 4, len(raw))


def test_a_strided_output_buffer_is_refused():
    """Decoded bytes would go into a reshaped copy of a strided buffer, and be lost."""
    raw = np.arange(64, dtype=np.float32).view(np.uint8)
    enc = codec.encode(raw, 4, level=1)
    out = np.empty(2 * len(raw), dtype=np.uint8)[::2]
    with pytest.raises(ValueError, match="contiguous"):
        codec.decode(enc.data, enc.planes, 4, len(raw), out)


def test_an_empty_part_decodes_from_a_table_of_empty_planes():
    """A table of empty planes (a part of no elements) decodes to nothing, not a crash."""
    assert len(codec.decode(b"", [["raw", 0]] * 4, 4, 0)) == 0
    assert len(codec.decode(b"", [["raw", 0]], 4, 0)) == 0

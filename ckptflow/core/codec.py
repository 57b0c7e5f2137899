"""Encoding of stored bytes: byte grouping, zstd, delta (XOR against a base), and hashing.

A tensor part is stored as its byte planes (byte k of every element together: the exponent
bytes of floats compress well, the low mantissa bytes do not). Each plane is compressed with
zstd unless a sample of it does not compress, in which case it is stored raw, so incompressible
planes cost no compression time. A part stored uncompressed is stored raw and ungrouped, so a
load reads it in one piece (with `compress="auto"` the writer chooses per part, from what each
mode costs on the root: ckptflow.core.adaptive). A delta part stores `raw XOR base` (or their
difference) the same way: unchanged bits become zero bytes that compress to almost nothing
(ckptflow.core.deltas).

Checksums (xxh3-128) cover the stored bytes, so corruption is found before decompression.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass

import numpy as np
import xxhash
import zstandard

from ckptflow.core.localio import scratch

SAMPLE_BYTES = 64 * 1024
# A plane whose sample compresses to more than this fraction is stored raw.
RAW_THRESHOLD = 0.92
MAX_PLANES = 16
# A grouped part is decoded this many bytes (of words) at a time: the block of each plane and
# of the words they make stay in the L2 cache.
INFLATE_BLOCK = 1 << 20
# Level 1 (the default) means these parameters, measured on the byte planes of LLM-shaped fp32
# and bf16 state (weights, AdamW moments): the exponent plane compresses ~2.9x faster than at
# zstd's level 1 and to a smaller size (0.243 vs 0.271 of the plane), because its gain is
# entropy coding of 256 symbols, not long matches, so a tiny match finder is enough. Other
# levels are zstd's own. Frames stay standard: any reader decodes both.
TUNED_LEVEL = 1
TUNED = dict(
    strategy=zstandard.STRATEGY_FAST,
    window_log=17,
    hash_log=6,
    chain_log=6,
    search_log=1,
    min_match=7,
)

_local = threading.local()


def digest(data) -> str:
    """xxh3-128 hex digest: the checksum of stored bytes and the content address."""
    return xxhash.xxh3_128_hexdigest(data)


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    if level not in cache:
        if level == TUNED_LEVEL:
            params = zstandard.ZstdCompressionParameters(**TUNED, write_content_size=True)
            cache[level] = zstandard.ZstdCompressor(compression_params=params)
        else:
            cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return cache[level]


def _decompressor(slot: int = 0) -> zstandard.ZstdDecompressor:
    """This thread's decompressor `slot`: frames read in step need one each, as readers of
    one decompressor share its context (two planes read by turns were decoded as garbage)."""
    cache = getattr(_local, "decompressors", None)
    if cache is None:
        cache = _local.decompressors = {}
    if slot not in cache:
        cache[slot] = zstandard.ZstdDecompressor()
    return cache[slot]


@dataclass(frozen=True)
class Encoded:
    """Stored bytes of one part (as a list of buffers, never joined for local files).

    Raw planes may view this thread's gather buffer: write them before this thread encodes
    again."""

    chunks: list  # buffers (bytes or contiguous uint8 arrays) in plane order
    planes: list  # [[codec, stored_len], ...] in plane order; codec "zstd" | "raw"

    @property
    def nbytes(self) -> int:
        return sum(length for _, length in self.planes)

    def digest(self) -> str:
        """xxh3-128 of the stored bytes, streamed over the chunks."""
        h = xxhash.xxh3_128()
        for c in self.chunks:
            h.update(c)
        return h.hexdigest()

    @property
    def data(self) -> bytes:
        return b"".join(self.chunks)


# Elements per block of a gather: the block's words and its planes stay in the L2 cache.
GATHER_BLOCK = 1 << 18
# Planes are taken from whole words by shift and truncation (vectorised ufunc loops), twice as
# fast as numpy's strided byte copy (0.25 against 0.46 CPU-s per GiB of fp32). Byte k of a word
# is its k-th byte in memory only on a little-endian host: elsewhere the strided copy runs.
_WORDS = {2: np.uint16, 4: np.uint32, 8: np.uint64} if sys.byteorder == "little" else {}


def gather(raw: np.ndarray, width: int, out: np.ndarray) -> None:
    """Byte plane k of `raw` (byte k of every `width`-byte element) into out[k*n:(k+1)*n]."""
    n = len(raw) // width
    words = _WORDS.get(width)
    if words is None or not raw.flags.c_contiguous:
        cols = raw.reshape(-1, width)
        for k in range(width):
            np.copyto(out[k * n : (k + 1) * n], cols[:, k])
        return
    w = raw.view(words)
    for s in range(0, n, GATHER_BLOCK):
        block = w[s : s + GATHER_BLOCK]
        for k in range(width):
            dst = out[k * n + s : k * n + s + len(block)]
            np.right_shift(block, 8 * k, out=dst, casting="unsafe")


GATHER = "gather"  # the default gather buffer's name (localio.scratch)


def encode(
    raw: np.ndarray, width: int, level: int, compress: bool = True, buffer: str = GATHER
) -> Encoded:
    """Encode raw uint8 bytes of elements `width` bytes wide (1 for non-float data).

    `compress=True` groups the bytes and compresses every plane whose sample compresses (the
    others are stored raw); False stores the part raw and ungrouped, so a load reads it in one
    piece straight into its destination. (`compress="auto"` is decided per part by the writer,
    ckptflow.core.adaptive.)

    A compressed part's stored bytes are assembled in this thread's aligned gather buffer, in
    stored order (every plane gathered into it, then each compressed plane's frame written over
    its plane and later raw planes moved up behind it), so a local object is written with
    O_DIRECT straight from it: as a list of planes, every byte went through the write's bounce
    buffer once more. `buffer` names the gather buffer (localio.scratch): a writer thread
    alternates between buffers so that one is written while it fills the next."""
    if not compress or not len(raw):
        return Encoded([raw], [["raw", len(raw)]])
    grouped = width > 1 and len(raw) % width == 0
    n_planes = width if grouped else 1
    head = raw[: SAMPLE_BYTES * n_planes]
    cols = head.reshape(-1, n_planes)
    pays = [_compresses(np.ascontiguousarray(cols[:, k]), level) for k in range(n_planes)]
    if pays == [False]:  # one plane, stored raw: the raw bytes themselves
        return Encoded([raw], [["raw", len(raw)]])
    out = scratch(buffer, len(raw))
    plane_len = len(raw) // n_planes
    if grouped:  # every plane in place first: planes compress from there, raw ones stay put
        gather(raw, n_planes, out)
    source = out if grouped else raw
    pos, planes = 0, []
    for k, pay in enumerate(pays):
        plane = source[k * plane_len : (k + 1) * plane_len]
        frame = _compressed_plane(plane, level) if pay else None
        if frame is not None:
            # Only over its own plane or earlier ones: a frame is shorter than its plane.
            out[pos : pos + len(frame)] = np.frombuffer(frame, dtype=np.uint8)
            planes.append(["zstd", len(frame)])
            pos += len(frame)
        else:
            _place(out, pos, plane)
            planes.append(["raw", plane_len])
            pos += plane_len
    return Encoded([out[:pos]], planes)


def _place(out: np.ndarray, pos: int, plane: np.ndarray) -> None:
    """Put a raw plane at out[pos:]: nothing to do when it is there already (every raw plane
    before the first frame). A raw plane after a frame moves back over its own bytes: numpy
    copies through a temporary where source and destination overlap."""
    dst = out[pos : pos + len(plane)]
    if dst.ctypes.data != plane.ctypes.data:
        np.copyto(dst, plane)


def _compressed_plane(plane: np.ndarray, level: int) -> bytes | None:
    """The zstd frame of one contiguous byte plane, or None when the frame is no smaller than
    the plane: its sample compressed, the rest need not, and a frame that grew would overrun
    the gather buffer."""
    frame = _compressor(level).compress(plane.data)
    return frame if len(frame) < len(plane) else None


def _compresses(sample: np.ndarray, level: int) -> bool:
    """Whether a plane whose first bytes are `sample` compresses enough to be worth it."""
    ratio = len(_compressor(level).compress(sample.data)) / max(len(sample), 1)
    return ratio <= RAW_THRESHOLD


def decode(
    stored: bytes | memoryview,
    planes: list,
    width: int,
    raw_size: int,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Decode stored bytes back to raw uint8 bytes (validating every length)."""
    n_planes = len(planes)
    if n_planes not in (1, width) or raw_size % n_planes:
        raise ValueError(f"bad plane layout: {n_planes} planes for width {width}")
    plane_len = raw_size // n_planes
    # Decoding into the caller's buffer avoids a copy when parts are assembled into one item.
    out = np.empty(raw_size, dtype=np.uint8) if out is None else out
    if len(out) != raw_size or not out.flags.c_contiguous:
        # (a strided output would be reshaped into a copy, and the decoded bytes lost with it)
        raise ValueError("output buffer has the wrong size or is not contiguous")
    pieces = _pieces(memoryview(stored), planes, plane_len)
    if n_planes == 1:
        codec, piece = pieces[0]
        if codec == "zstd":  # straight into the output
            _inflate(piece, plane_len, out)
        else:
            out[:] = np.frombuffer(piece, dtype=np.uint8)
        return out
    # Every plane is read a block at a time, in step, and the blocks are interleaved straight
    # into the output: no intermediate grouped buffer, and a compressed plane never needs a
    # buffer of its whole length (16 MiB per read in flight for a 64 MiB fp32 part).
    block = max(1, min(INFLATE_BLOCK // n_planes, plane_len))
    # Every frame's declared size is checked before any block buffer is allocated.
    sources = [
        _frame_reader(p, plane_len, slot=k) if c == "zstd" else p for k, (c, p) in enumerate(pieces)
    ]
    streams = [
        _plane_blocks(source, plane_len, block, f"plane{k}") for k, source in enumerate(sources)
    ]
    _interleave(streams, n_planes, out)
    return out


def _pieces(view: memoryview, planes: list, plane_len: int) -> list:
    """(codec, stored bytes) of every plane, each length checked against the table before
    anything is decoded."""
    pieces, pos = [], 0
    for codec, length in planes:
        if codec not in ("zstd", "raw"):
            raise ValueError(f"unknown codec {codec!r}")
        if codec == "raw" and length != plane_len:
            raise ValueError("decoded plane has the wrong length")
        piece = view[pos : pos + length]
        if len(piece) != length:
            raise ValueError("stored data shorter than its plane table")
        pieces.append((codec, piece))
        pos += length
    if pos != len(view):
        raise ValueError("stored data longer than its plane table")
    return pieces


def _plane_blocks(source, plane_len: int, block: int, buffer: str):
    """The bytes of one plane, `block` at a time: views of a raw plane (a memoryview), or a
    zstd frame (its reader) inflated into this thread's scratch buffer `buffer` (each block
    valid until the next)."""
    if isinstance(source, memoryview):
        plane = np.frombuffer(source, dtype=np.uint8)
        for s in range(0, plane_len, block):
            yield plane[s : s + block]
        return
    buf = scratch(buffer, block)
    got = 0
    while got < plane_len:
        n = min(block, plane_len - got)
        view, filled = memoryview(buf)[:n], 0
        while filled < n:
            filled += _read_block(source, view[filled:], got + filled, plane_len)
        got += n
        yield buf[:n]


def _interleave(streams: list, width: int, out: np.ndarray) -> None:
    """Blocks of every plane, in step, into the output: word k-th bytes by widening, shift and
    OR (vectorised ufunc loops, 0.58 against 0.64 decode CPU-s per GiB of fp32 with numpy's
    strided byte copy), or by strided column copies where words do not apply (see _WORDS)."""
    words = _WORDS.get(width)
    w = out.view(words) if words is not None else None
    size = min(INFLATE_BLOCK, len(out))
    tmp = scratch("words", size).view(words) if w is not None else None
    columns = out.reshape(-1, width)
    s = 0
    for blocks in zip(*streams, strict=True):
        n = len(blocks[0])
        if w is None:
            for k, b in enumerate(blocks):
                columns[s : s + n, k] = b
        else:
            o, t = w[s : s + n], tmp[:n]
            np.copyto(o, blocks[0], casting="unsafe")
            for k in range(1, width):
                np.copyto(t, blocks[k], casting="unsafe")
                np.left_shift(t, 8 * k, out=t)
                np.bitwise_or(o, t, out=o)
        s += n


def _frame_reader(piece: memoryview, plane_len: int, slot: int = 0):
    """A reader of one zstd plane of exactly `plane_len` bytes (what the manifest declares).

    The decoder allocates what the frame header declares, whatever max_output_size says: a
    frame of a few KiB can declare gigabytes. So the header must declare exactly the plane's
    length (our writer always writes it) before anything is decoded."""
    declared = zstandard.frame_content_size(piece)
    if declared != plane_len:
        what = "does not declare its size" if declared < 0 else f"declares {declared} bytes"
        raise ValueError(f"zstd frame {what}; the manifest declares {plane_len}")
    return _decompressor(slot).stream_reader(piece, read_across_frames=False)


def _read_block(reader, view: memoryview, got: int, plane_len: int) -> int:
    k = reader.readinto(view)
    if not k:
        raise ValueError(f"zstd frame ends after {got} of its {plane_len} bytes")
    return k


def _inflate(piece: memoryview, plane_len: int, dst: np.ndarray) -> np.ndarray:
    """One zstd plane straight into the contiguous `dst` of `plane_len` bytes."""
    reader = _frame_reader(piece, plane_len)
    view, got = memoryview(dst), 0
    while got < plane_len:
        got += _read_block(reader, view[got:], got, plane_len)
    return dst

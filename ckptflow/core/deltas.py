"""Delta parts: the transform of a part against its base (the same part of the last full
checkpoint) that is stored in its place, byte-grouped and compressed as a full part is
(ckptflow.core.codec), and the choice of transform from samples."""

from __future__ import annotations

import numpy as np

from ckptflow.core import codec


def xor(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bitwise XOR of two equally long uint8 arrays, in 8-byte words where aligned."""
    if len(a) % 8 == 0:
        return np.bitwise_xor(a.view(np.uint64), b.view(np.uint64)).view(np.uint8)
    return np.bitwise_xor(a, b)


# -- delta kinds (format version 3) ------------------------------------------------------------
# A delta part stores one of these transforms of (raw, base), byte-grouped and compressed as a
# full part is: "xor" (bits that did not change become zero; versions 1-2 knew only this) or
# "sub", the wrapping integer difference of the elements, zigzag-coded so that a small change
# of either sign has zero high bytes (XOR of a value whose mantissa carries into the exponent
# sets many bits; the difference stays small, and its sign lands in the incompressible low byte).
DELTA_KINDS = ("xor", "sub")
_INTS = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
_UINTS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
# A delta must store at least this much less than the full part to be chosen: it costs a base
# read on load and keeps the base alive.
DELTA_GAIN = 0.98
_SAMPLES = 4  # sample windows spread over a part (the start of a tensor is not typical)


def sub_ok(width: int, raw_size: int) -> bool:
    """Whether a "sub" delta is defined for elements `width` bytes wide."""
    return width in _INTS and raw_size % width == 0


def delta(kind: str, raw: np.ndarray, base: np.ndarray, width: int) -> np.ndarray:
    """The delta payload of `raw` against `base` (equally long uint8 arrays)."""
    if kind == "xor":
        return xor(raw, base)
    it = _INTS[width]
    d = np.subtract(raw.view(it), base.view(it))  # wraps: every difference is representable
    sign = np.right_shift(d, 8 * width - 1)
    np.left_shift(d, 1, out=d)
    np.bitwise_xor(d, sign, out=d)
    return d.view(np.uint8)


def undelta(kind: str, payload: np.ndarray, base: np.ndarray, width: int) -> np.ndarray:
    """Rebuild raw bytes in place from a decoded delta payload and its base's raw bytes."""
    if len(payload) != len(base):
        raise ValueError("delta and base sizes differ")
    if kind == "xor":
        np.bitwise_xor(payload, base, out=payload)
        return payload
    if kind != "sub" or not sub_ok(width, len(payload)):
        raise ValueError(f"unknown delta kind {kind!r} for width {width}")
    ut = _UINTS[width]
    z = payload.view(ut)
    sign = np.bitwise_and(z, 1)
    np.negative(sign, out=sign)  # 0 or all ones (unsigned arithmetic wraps)
    np.right_shift(z, 1, out=z)
    np.bitwise_xor(z, sign, out=z)
    np.add(z, base.view(ut), out=z)
    return payload


def _sample(raw: np.ndarray, width: int) -> np.ndarray:
    """Up to codec.SAMPLE_BYTES of `raw` in _SAMPLES windows spread over it, whole elements."""
    n = len(raw)
    if n <= codec.SAMPLE_BYTES:
        return raw
    win = codec.SAMPLE_BYTES // _SAMPLES // width * width
    starts = [(n - win) * i // (_SAMPLES - 1) // width * width for i in range(_SAMPLES)]
    return np.concatenate([raw[s : s + win] for s in starts])


def choose_delta(raw: np.ndarray, base: np.ndarray, width: int, level: int) -> str | None:
    """The delta kind that stores `raw` smallest, or None when storing it full pays better.

    Judged on samples of each candidate encoded (compressed) as the part would be: costs a
    few small compressions per part, against encoding the whole part once per candidate. (A
    delta is only worth it compressed: the writer asks only for parts it compresses.)"""
    if len(raw) != len(base) or not len(raw):
        return None
    s_raw, s_base = _sample(raw, width), _sample(base, width)
    kinds = [k for k in DELTA_KINDS if k == "xor" or sub_ok(width, len(raw))]
    sizes = {k: codec.encode(delta(k, s_raw, s_base, width), width, level).nbytes for k in kinds}
    best = min(kinds, key=lambda k: (sizes[k], k != "xor"))
    return best if sizes[best] < DELTA_GAIN * codec.encode(s_raw, width, level).nbytes else None

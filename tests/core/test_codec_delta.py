"""Delta kinds: XOR and the zigzag-coded integer difference round-trip exactly; the choice."""

from __future__ import annotations

import numpy as np
import pytest

from ckptflow.core import codec


@pytest.mark.parametrize("width", [1, 2, 4, 8])
@pytest.mark.parametrize("kind", codec.DELTA_KINDS)
def test_every_delta_kind_round_trips_bitwise(kind, width):
    rng = np.random.default_rng(width)
    raw = rng.integers(0, 256, 8192, dtype=np.uint8)
    base = rng.integers(0, 256, 8192, dtype=np.uint8)
    # the extremes wrap: 0 - max and max - 0 are representable differences
    raw[:width], base[:width] = 0, 255
    raw[width : 2 * width], base[width : 2 * width] = 255, 0
    payload = codec.delta(kind, raw, base, width).copy()
    assert codec.undelta(kind, payload, base, width) is payload
    assert np.array_equal(payload, raw)


def test_a_small_change_of_either_sign_has_zero_high_bytes():
    base = np.arange(1, 1025, dtype=np.float32)
    raw = base.copy()
    raw.view(np.int32)[::2] += 3  # a few ulps up and down
    raw.view(np.int32)[1::2] -= 3
    z = codec.delta("sub", raw.view(np.uint8), base.view(np.uint8), 4).view(np.uint32)
    assert int(z.max()) < 256, "zigzag keeps the sign in the low byte"


def test_undelta_refuses_an_unknown_kind_or_width():
    a = np.zeros(12, dtype=np.uint8)
    with pytest.raises(ValueError):
        codec.undelta("sub", a.copy(), a, 16)
    with pytest.raises(ValueError):
        codec.undelta("add", a.copy(), a, 4)
    with pytest.raises(ValueError):
        codec.undelta("xor", a.copy(), a[:8], 4)


def test_the_choice_is_the_smallest_or_full_when_no_delta_pays():
    rng = np.random.default_rng(0)
    base = (rng.standard_normal(1 << 18) * 0.02).astype(np.float32)
    # mantissa carries into the exponent bits: XOR sets many bits, the difference stays small
    stepped = (base + np.float32(1e-4) * rng.standard_normal(base.size)).astype(np.float32)
    fresh = (rng.standard_normal(base.size) * 0.02).astype(np.float32)  # unrelated values
    b = base.view(np.uint8)
    assert codec.choose_delta(stepped.view(np.uint8), b, 4, 1) == "sub"
    assert codec.choose_delta(fresh.view(np.uint8), b, 4, 1) is None
    assert codec.choose_delta(stepped.view(np.uint8), b, 4, 1, compress=False) is None
    assert codec.choose_delta(stepped.view(np.uint8)[:-1], b[:-1], 16, 1) in ("xor", None)

"""Delta kinds: XOR and the zigzag-coded integer difference round-trip exactly; the choice."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptflow.core import codec, deltas


@pytest.mark.parametrize("width", [1, 2, 4, 8])
@pytest.mark.parametrize("kind", deltas.DELTA_KINDS)
def test_every_delta_kind_round_trips_bitwise(kind, width):
    rng = np.random.default_rng(width)
    raw = rng.integers(0, 256, 8192, dtype=np.uint8)
    base = rng.integers(0, 256, 8192, dtype=np.uint8)
    # the extremes wrap: 0 - max and max - 0 are representable differences
    raw[:width], base[:width] = 0, 255
    raw[width : 2 * width], base[width : 2 * width] = 255, 0
    payload = deltas.delta(kind, raw, base, width).copy()
    assert deltas.undelta(kind, payload, base, width) is payload
    assert np.array_equal(payload, raw)


def test_a_small_change_of_either_sign_has_zero_high_bytes():
    base = np.arange(1, 1025, dtype=np.float32)
    raw = base.copy()
    raw.view(np.int32)[::2] += 3  # a few ulps up and down
    raw.view(np.int32)[1::2] -= 3
    z = deltas.delta("sub", raw.view(np.uint8), base.view(np.uint8), 4).view(np.uint32)
    assert int(z.max()) < 256, "zigzag keeps the sign in the low byte"


def test_undelta_refuses_an_unknown_kind_or_width():
    a = np.zeros(12, dtype=np.uint8)
    with pytest.raises(ValueError):
        deltas.undelta("sub", a.copy(), a, 16)
    with pytest.raises(ValueError):
        deltas.undelta("add", a.copy(), a, 4)
    with pytest.raises(ValueError):
        deltas.undelta("xor", a.copy(), a[:8], 4)


def test_the_choice_is_the_smallest_or_full_when_no_delta_pays():
    rng = np.random.default_rng(0)
    base = (rng.standard_normal(1 << 18) * 0.02).astype(np.float32)
    # mantissa carries into the exponent bits: XOR sets many bits, the difference stays small
    stepped = (base + np.float32(1e-4) * rng.standard_normal(base.size)).astype(np.float32)
    fresh = (rng.standard_normal(base.size) * 0.02).astype(np.float32)  # unrelated values
    b = base.view(np.uint8)
    assert deltas.choose_delta(stepped.view(np.uint8), b, 4, 1) == "sub"
    assert deltas.choose_delta(fresh.view(np.uint8), b, 4, 1) is None
    assert deltas.choose_delta(stepped.view(np.uint8)[:-1], b[:-1], 16, 1) in ("xor", None)


_WIDTHS = st.sampled_from([1, 2, 4, 8])


@settings(max_examples=60, deadline=None)
@given(width=_WIDTHS, data=st.data())
def test_any_bytes_round_trip_bitwise_through_every_delta_kind(width, data):
    n = data.draw(st.integers(0, 64)) * width
    raw = np.frombuffer(data.draw(st.binary(min_size=n, max_size=n)), dtype=np.uint8)
    base = np.frombuffer(data.draw(st.binary(min_size=n, max_size=n)), dtype=np.uint8)
    for kind in deltas.DELTA_KINDS:
        payload = deltas.delta(kind, raw, base, width).copy()
        assert np.array_equal(deltas.undelta(kind, payload, base, width), raw), kind


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    step=st.sampled_from([0.0, 1e-7, 1e-4, 1e-2, 1.0]),
    n=st.integers(1, 40_000),
)
def test_the_chosen_delta_stored_as_a_part_is_decoded_bitwise(seed, step, n):
    """Whatever choose_delta picks (or full), encode + decode + undelta give back the bytes."""
    rng = np.random.default_rng(seed)
    base = (rng.standard_normal(n) * 0.02).astype(np.float32)
    cur = (base + np.float32(step) * rng.standard_normal(n)).astype(np.float32)
    raw, b = cur.view(np.uint8), base.view(np.uint8)
    kind = deltas.choose_delta(raw, b, 4, 1)
    assert kind in (None, *deltas.DELTA_KINDS)
    payload = deltas.delta(kind, raw, b, 4) if kind else raw
    enc = codec.encode(payload, 4, 1)
    out = codec.decode(enc.data, enc.planes, 4, len(raw))
    if kind:
        deltas.undelta(kind, out, b, 4)
    assert np.array_equal(out, raw)
    if step == 0.0 and n >= 1024:
        assert kind is not None, "an unchanged tensor must be stored as a delta"

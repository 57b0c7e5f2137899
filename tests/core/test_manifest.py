"""The manifest's own rules: unambiguous item keys, chunks that tile their tensor exactly."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as hs

from ckptflow.core import manifest as mf

fqns = hs.text(alphabet=hs.sampled_from("a@%,./é0\x00"), max_size=8) | hs.text(max_size=6)
offsets = hs.none() | hs.lists(hs.integers(0, 1 << 40), max_size=4)


def _readings(key: str):
    """Every (fqn, offsets) a reader could take `key` for, splitting it at any `@`."""
    yield key, None
    for i, c in enumerate(key):
        if c == "@":
            tail = key[i + 1 :]
            if tail == "":
                yield key[:i], []
            elif all(p.isdigit() for p in tail.split(",")):
                yield key[:i], [int(p) for p in tail.split(",")]


@settings(max_examples=500, derandomize=True, database=None)
@given(hs.tuples(fqns, offsets), hs.tuples(fqns, offsets))
def test_item_keys_are_unambiguous(a, b):
    """Distinct (fqn, offsets) never share a key: `a` at [0] and the value `a@0` differ."""
    key = mf.item_key(*a)
    for other in [b, *_readings(key)]:
        if other != a:
            assert mf.item_key(*other) != key, (a, other)


def test_item_keys_of_plain_names_read_as_before():
    assert mf.item_key("model.w", [0, 4]) == "model.w@0,4"
    assert mf.item_key("step", None) == "step"
    assert mf.item_key("a", [0]) != mf.item_key("a@0", None)

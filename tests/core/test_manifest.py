"""The manifest's own rules: unambiguous item keys, chunks that tile their tensor exactly."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from ckptflow.core import layout
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


def _manifest(size: list[int], chunks: list[tuple[list[int], list[int]]]) -> dict:
    """A self-consistent manifest of one float32 tensor `w` stored as `chunks` (offsets,
    sizes), one raw part each (validation never reads objects)."""
    items, objects = {}, {}
    for i, (offs, sizes) in enumerate(chunks):
        raw = math.prod(sizes) * 4
        key = f"{i:032x}"
        objects[key] = {"size": raw}
        part = {
            "object": key,
            "stored_size": raw,
            "raw_offset": 0,
            "raw_size": raw,
            "raw_hash": "0" * 32,
            "width": 4,
            "planes": [["raw", raw]],
            "base": None,
            "reused": False,
        }
        items.setdefault(
            mf.item_key("w", offs), {"fqn": "w", "offset": offs, "sizes": sizes, "parts": [part]}
        )
    return {
        "format": layout.MANIFEST_FORMAT,
        "format_version": layout.FORMAT_VERSION,
        "step": 1,
        "world_size": 1,
        "root_id": "r",
        "kind": "full",
        "base_step": None,
        "metadata": {},
        "objects": objects,
        "tensors": {
            "w": {
                "dtype": "float32",
                "size": size,
                "chunks": [{"offsets": o, "sizes": s} for o, s in chunks],
            }
        },
        "values": [],
        "items": items,
        "planner_data": None,
        "stats": {"raw_bytes": 0, "stored_bytes": 0, "new_bytes": 0},
        "created_at": 1.0,
    }


PINWHEEL = [
    ([0, 0], [2, 1]),
    ([0, 1], [1, 2]),
    ([1, 2], [2, 1]),
    ([2, 0], [1, 2]),
    ([1, 1], [1, 1]),
]
TILINGS = {
    "one chunk": ([8, 8], [([0, 0], [8, 8])]),
    "rows of 4 ranks, one empty": (
        [3, 2],
        [([0, 0], [1, 2]), ([1, 0], [1, 2]), ([2, 0], [1, 2]), ([3, 0], [0, 2])],
    ),
    "2 x 2 grid, uneven": (
        [5, 3],
        [([0, 0], [3, 2]), ([0, 2], [3, 1]), ([3, 0], [2, 2]), ([3, 2], [2, 1])],
    ),
    "64 x 64 grid": ([128, 64], [([2 * i, j], [2, 1]) for i in range(64) for j in range(64)]),
    "pinwheel (no grid)": ([3, 3], PINWHEEL),
    "staircase (no grid)": (
        [400, 400],
        [([i, 0], [1, i + 1]) for i in range(400)]
        + [([i, i + 1], [1, 399 - i]) for i in range(399)],
    ),
    "full-height columns, one split in rows": (
        [300, 301],
        [([0, j], [300, 1]) for j in range(300)] + [([i, 300], [1, 1]) for i in range(300)],
    ),
    "3-d bricks": (
        [2, 2, 2],
        [([0, 0, 0], [1, 2, 2]), ([1, 0, 0], [1, 1, 2]), ([1, 1, 0], [1, 1, 2])],
    ),
    "0-dim": ([], [([], [])]),
    "empty tensor": ([0, 8], [([0, 0], [0, 8])]),
}
NOT_TILINGS = {
    "a duplicated chunk (same volume)": ([8, 8], [([0, 0], [4, 8]), ([0, 0], [4, 8])]),
    "overlap and gap of equal size": ([4, 4], [([0, 0], [3, 4]), ([2, 0], [1, 4])]),
    "pinwheel with a shifted center": ([3, 3], [*PINWHEEL[:4], ([1, 0], [1, 1])]),
    "a gap": ([8, 8], [([0, 0], [4, 8])]),
    "a 0-dim tensor stored twice": ([], [([], []), ([], [])]),
    "3-d bricks overlapping": (
        [2, 2, 2],
        [([0, 0, 0], [1, 2, 2]), ([1, 0, 0], [1, 1, 2]), ([0, 1, 0], [1, 1, 2])],
    ),
}


@pytest.mark.parametrize("name", list(TILINGS))
def test_chunks_that_tile_the_tensor_are_accepted(name):
    mf.validate(_manifest(*TILINGS[name]))


@pytest.mark.parametrize("name", list(NOT_TILINGS))
def test_chunks_that_overlap_or_leave_gaps_are_refused(name):
    with pytest.raises(mf.ManifestError, match="chunks"):
        mf.validate(_manifest(*NOT_TILINGS[name]))


def test_chunk_layouts_too_irregular_to_check_cheaply_are_refused():
    """Columns beside rows: every order of cuts costs ~n^2 pieces for 4n chunks (no planner
    makes this; checking it would cost without bound)."""
    n = 200
    cols = [([0, j], [n, 1]) for j in range(n)] + [([i, n], [1, n]) for i in range(n)]
    rows = [([n + i, 0], [1, n]) for i in range(n)] + [([n, n + j], [n, 1]) for j in range(n)]
    with pytest.raises(mf.ManifestError, match="too irregular"):
        mf.validate(_manifest([2 * n, 2 * n], cols + rows))


# -- packed parts (format version 4) ---------------------------------------------------------
def _packed(n_parts: int = 4, part: int = 64) -> dict:
    """A manifest of one float32 tensor of `n_parts` raw parts, all packed into one object."""
    m = _manifest([n_parts * part // 4], [([0], [n_parts * part // 4])])
    (item,) = m["items"].values()
    (p,) = item["parts"]
    pack = "f" * 32
    m["objects"] = {pack: {"size": n_parts * part}}
    item["parts"] = [
        dict(
            p,
            object=pack,
            stored_size=n_parts * part,
            span=[i * part, part],
            raw_offset=i * part,
            raw_size=part,
            planes=[["raw", part]],
        )
        for i in range(n_parts)
    ]
    return m


def test_parts_that_share_a_pack_validate():
    mf.validate(_packed())


@pytest.mark.parametrize(
    "forge, why",
    [
        (lambda p, m: p.update(span=[250, 64]), "outside its object"),
        (lambda p, m: p.update(span=[-1, 64]), "span"),
        (lambda p, m: p.update(span=[0, 64, 1]), "expected \\[start, length\\]"),
        (lambda p, m: p.update(span="0,64"), "expected \\[start, length\\]"),
        (lambda p, m: p.update(span=[0, 32]), "do not add up"),
        (lambda p, m: m.update(format_version=3), "need format version 4"),
        (
            lambda p, m: (
                m["objects"][p["object"]].update(size=mf.MAX_PACK + 64),
                [
                    q.update(stored_size=mf.MAX_PACK + 64)
                    for q in next(iter(m["items"].values()))["parts"]
                ],
            ),
            "too large to share",
        ),
    ],
    ids=["past-end", "negative", "three", "string", "planes", "version-3", "huge-pack"],
)
def test_a_forged_span_is_refused(forge, why):
    """A span must lie inside its pack, match the part's planes, and its pack be small enough
    for a reader to hold whole; older versions have no spans."""
    m = _packed()
    forge(next(iter(m["items"].values()))["parts"][-1], m)
    with pytest.raises(mf.ManifestError, match=why):
        mf.validate(m)

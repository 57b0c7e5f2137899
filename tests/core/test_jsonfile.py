"""The bounded JSON reader: size, depth and integer digits bounded; every failure names the file."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from ckptflow.core import jsonfile
from ckptflow.core.errors import CorruptCheckpoint
from ckptflow.core.storage import Storage


def test_ordinary_json_parses_as_json_does():
    doc = {"a": [1, -2, 3.5, None, True, 'x[{\\"]'], "b": {"c": "\u00e9"}, "n": float("nan")}
    blob = json.dumps(doc).encode()
    got = jsonfile.loads(blob, what="f")
    assert got["a"] == doc["a"] and got["b"] == doc["b"] and got["n"] != got["n"]
    assert jsonfile.loads(blob.decode(), what="f")["a"] == doc["a"]


@pytest.mark.parametrize(
    ("blob", "reason"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested deeper than 64"),
        (b'{"a": ' + b"[" * 65 + b"]" * 65 + b"}", "nested deeper than 64"),
        (b'{"n": ' + b"7" * 5000 + b"}", "integer of 5000 digits"),
        (b'{"n": -' + b"7" * 101 + b"}", "integer of 102 digits"),
        (b"\xff\xfe", "not JSON"),
        (b'{"a": 1', "not JSON"),
        (b"", "not JSON"),
        (b" " * 20, "larger than 10 bytes"),
    ],
)
def test_hostile_json_is_a_bad_file_naming_it(blob, reason):
    limits = {"max_bytes": 10} if reason.startswith("larger") else {}
    with pytest.raises(jsonfile.BadJsonFile, match=reason) as info:
        jsonfile.loads(blob, what="s3://b/ckpt/step-00000003/COMMIT", **limits)
    assert isinstance(info.value, CorruptCheckpoint)
    assert info.value.files == ["s3://b/ckpt/step-00000003/COMMIT"]
    assert str(info.value).startswith("s3://b/ckpt/step-00000003/COMMIT: ")


def test_brackets_and_escapes_inside_strings_are_not_nesting():
    tricky = ["[" * 200, "\\", '"[[[', "\\\\", "]]]]" * 50]
    blob = json.dumps({"s": tricky, "t": [[["ok"]]]}).encode()
    assert jsonfile.nesting_depth(blob) == 4
    assert jsonfile.loads(blob, what="f", max_depth=4)["s"] == tricky
    with pytest.raises(jsonfile.BadJsonFile):
        jsonfile.loads(blob, what="f", max_depth=3)


def test_limits_are_the_callers():
    deep = b"[" * 100 + b"]" * 100
    assert jsonfile.loads(deep, what="f", max_depth=100)
    assert jsonfile.loads(b"1" * 300, what="f", max_int_digits=300) == int("1" * 300)


def test_read_bounds_the_bytes_it_reads(tmp_path):
    st = Storage(str(tmp_path))
    st.write("big.json", b"[" + b"1," * 1000 + b"1]")
    with pytest.raises(jsonfile.BadJsonFile, match="larger than 100 bytes") as info:
        jsonfile.read(st, "big.json", max_bytes=100)
    assert info.value.files == [st.url("big.json")]
    with pytest.raises(FileNotFoundError):
        jsonfile.read(st, "absent.json")


def _depth(v) -> int:
    if isinstance(v, list):
        return 1 + max(map(_depth, v), default=0)
    if isinstance(v, dict):
        return 1 + max(map(_depth, v.values()), default=0)
    return 0


_TEXT = hs.text(alphabet=hs.sampled_from('ab[]{}"\\\n/u\u00e9'), max_size=8)
_JSON = hs.recursive(
    hs.none() | hs.booleans() | hs.integers(-(10**30), 10**30) | hs.floats(allow_nan=False) | _TEXT,
    lambda kids: hs.lists(kids, max_size=4) | hs.dictionaries(_TEXT, kids, max_size=4),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(doc=_JSON, indent=hs.sampled_from([None, 1]), ascii_only=hs.booleans())
def test_the_depth_pre_scan_is_exact_and_loads_agrees_with_json(doc, indent, ascii_only):
    """Brackets, quotes and backslashes inside strings never count: the pre-scan finds the
    true depth, and what parses equals what `json.loads` makes."""
    blob = json.dumps(doc, indent=indent, ensure_ascii=ascii_only).encode()
    assert jsonfile.nesting_depth(blob) == _depth(doc)
    assert jsonfile.loads(blob, what="f") == json.loads(blob)


def test_long_digit_runs_in_strings_and_100_digit_integers_still_parse():
    """Integers are checked one by one only where a long digit run exists at all (the fast
    path parses without a per-integer call): a run inside a string is no integer."""
    assert jsonfile.loads(b'{"s": "' + b"9" * 500 + b'", "n": 5}', what="f") == {
        "s": "9" * 500,
        "n": 5,
    }
    assert jsonfile.loads(b"[" + b"8" * 100 + b"]", what="f") == [int("8" * 100)]
    with pytest.raises(jsonfile.BadJsonFile, match="101 digits"):
        jsonfile.loads(b'{"s": "' + b"9" * 500 + b'", "n": ' + b"1" * 101 + b"}", what="f")


def _collections_during(fn) -> int:
    import gc

    seen = []
    count = lambda phase, info: seen.append(1) if phase == "start" else 0  # noqa: E731
    gc.callbacks.append(count)
    try:
        fn()
    finally:
        gc.callbacks.remove(count)
    return len(seen)


def test_a_parse_runs_no_garbage_collection():
    """A parse builds a tree: a collection during it frees nothing and only ages the new
    objects (a manifest's, on every rank, then set off full-heap collections: issue 36).
    One young collection may follow it, once the collector is back (it was 21 here)."""
    blob = json.dumps({"items": [{"parts": [{"n": i}], "size": [i, i]} for i in range(5000)]})
    assert _collections_during(lambda: jsonfile.loads(blob, what="m", max_bytes=1 << 24)) <= 1


def test_a_parse_leaves_the_collector_as_it_found_it():
    import gc

    was = gc.isenabled()
    try:
        gc.disable()  # a caller's choice: kept, even across nested parses
        with jsonfile.collector_paused():
            jsonfile.loads("[1]", what="x")
        assert not gc.isenabled()
        gc.enable()
        with pytest.raises(jsonfile.BadJsonFile):
            jsonfile.loads("{", what="x")  # a refused file re-enables it too
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()

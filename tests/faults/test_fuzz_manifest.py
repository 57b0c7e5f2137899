"""Hypothesis fuzz of the manifest parser (`manifest.parse`, then `rootreader.read_manifest` and a
load for what the parser accepts): every outcome is a result or a clean error, with no read
outside the root and no large allocation. 300 cases by default, 10,000 with -m slow.

Cases mutate a real manifest (a delta step with tensors of two dtypes and non-tensor values):
subtrees replaced by random JSON or hostile values (`../` paths, absolute paths, huge and
negative numbers, pickles), keys dropped or added, bytes overwritten, truncation, and random
bytes. A manifest the parser accepts is committed in a root holding the real objects and
loaded through a filesystem that records every path.
"""

from __future__ import annotations

import atexit
import base64
import copy
import functools
import json
import os
import pickle
import shutil
import tempfile
import tracemalloc

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer, CheckpointError, dcp_metadata
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from ckptflow.core import codec, layout, rootreader
from ckptflow.core import manifest as mf
from ckptflow.core.storage import Storage
from tests.faults.harness import MAX_PEAK, ReadRecordingFS


@functools.cache
def _seed() -> tuple[bytes, str, str]:
    """A real manifest (tensors, a delta, values), its root id, and a local root holding its
    objects and root marker but no step folders (each fuzz case commits its own)."""
    root = os.path.join(tempfile.mkdtemp(prefix="ckptflow-fuzz-"), "ckpt")
    atexit.register(shutil.rmtree, os.path.dirname(root), True)
    ck = Checkpointer(root, full_every=2)
    s = {"w": torch.randn(16, 16), "b": torch.randn(16).bfloat16(), "n": 3, "t": (1, "x")}
    ck.save(1, s)
    s["w"] = s["w"] + 1e-3
    ck.save(2, s)
    m = ck.manifest(2)
    shutil.rmtree(os.path.join(root, layout.step_dir(1)))
    shutil.rmtree(os.path.join(root, layout.step_dir(2)))
    return mf.dumps(m), m["root_id"], root


def _seed_manifest() -> tuple[bytes, str]:
    blob, root_id, _ = _seed()
    return blob, root_id


def _seed_template() -> dict:
    return {"w": torch.zeros(16, 16), "b": torch.zeros(16).bfloat16(), "n": None, "t": None}


HOSTILE_VALUES = [
    "../../etc/passwd",
    "/etc/passwd",
    "..",
    "",
    "0" * 32,
    "f" * 31,
    1 << 64,
    -1,
    -(1 << 63),
    1 << 44,
    1e308,
    float("inf"),
    True,
    None,
    [],
    {},
    [[]],
    {"": None},
    "cos\nsystem\n(S'ls'\ntR.",
    base64.b64encode(pickle.dumps(os.getpid)).decode(),
    "\x00",
    "é" * 10,
]

json_leaf = (
    hs.none()
    | hs.booleans()
    | hs.integers(min_value=-(1 << 70), max_value=1 << 70)
    | hs.floats(allow_nan=False)
    | hs.text(max_size=40)
    | hs.sampled_from(HOSTILE_VALUES).map(copy.deepcopy)  # fresh: never shared, never cyclic
)
json_value = hs.recursive(
    json_leaf,
    lambda kids: (
        hs.lists(kids, max_size=4) | hs.dictionaries(hs.text(max_size=10), kids, max_size=4)
    ),
    max_leaves=12,
)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


@hs.composite
def mutated_manifests(draw) -> bytes:
    blob, _ = _seed_manifest()
    how = draw(hs.sampled_from(["tree"] * 6 + ["bytes", "truncate", "random"]))
    if how == "random":
        return draw(hs.binary(max_size=512) | json_value.map(lambda v: json.dumps(v).encode()))
    if how in ("bytes", "truncate"):
        data = bytearray(blob)
        if how == "truncate":
            return bytes(data[: draw(hs.integers(0, len(data)))])
        for _ in range(draw(hs.integers(1, 4))):
            i = draw(hs.integers(0, len(data) - 1))
            data[i] = draw(hs.integers(0, 255))
        return bytes(data)
    m = json.loads(blob)
    for _ in range(draw(hs.integers(1, 3))):
        paths = list(_paths(m))
        path = draw(hs.sampled_from(paths[1:]))
        parent = m
        for p in path[:-1]:
            parent = parent[p]
        op = draw(hs.sampled_from(["replace", "replace", "delete", "add"]))
        if op == "delete" and isinstance(parent, dict):
            parent.pop(path[-1])
        elif op == "add" and isinstance(parent, dict):
            parent[draw(hs.text(max_size=8) | hs.sampled_from(HOSTILE_VALUES[:5]))] = draw(
                json_value
            )
        else:
            parent[path[-1]] = draw(json_value)
    return json.dumps(m).encode()


def _check_one(blob: bytes) -> str:
    """Parse; a manifest the parser accepts is then committed in the seed root and read the
    way a load reads it (catalog, then the reader through a recording filesystem): every
    outcome is a result or a CheckpointError, and nothing outside the root is touched."""
    try:
        m = mf.parse(blob)
    except mf.ManifestError:
        return "rejected"
    dcp_metadata.metadata_from_manifest(
        m
    )  # what a load builds first: must not raise once validated
    _, _, root = _seed()
    st = Storage(root)
    save_id, step = "0123456789abcdef", m["step"]
    st.write(f"{layout.step_dir(step)}/{layout.manifest_name(save_id)}", blob)
    st.write(
        layout.commit_path(step),
        json.dumps(
            {"save_id": save_id, "manifest_xxh3": codec.digest(blob), "step": step}
        ).encode(),
    )
    fs = ReadRecordingFS()
    try:
        rootreader.read_manifest(st, step)
        outcome = "loaded"
        try:
            Checkpointer("unused", storage=Storage(root, fs=fs), threads=1).load(
                _seed_template(), step=step
            )
        except CheckpointError:
            outcome = "refused by the load"
    except CheckpointError:
        outcome = "refused by the catalog"
    finally:
        shutil.rmtree(os.path.join(root, layout.step_dir(step)), ignore_errors=True)
    outside = [p for p in fs.paths if not os.path.abspath(p).startswith(root)]
    assert not outside, f"read outside the root: {outside}"
    return outcome


def _fuzz(blob: bytes, seen: dict) -> None:
    tracemalloc.start()
    try:
        outcome = _check_one(blob)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < MAX_PEAK + 4 * len(blob)
    seen[outcome] = seen.get(outcome, 0) + 1


_FUZZ_SEEN: dict = {}
_FUZZ_SEEN_SLOW: dict = {}
_FUZZ_SETTINGS = dict(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@settings(max_examples=300, derandomize=True, **_FUZZ_SETTINGS)
@given(mutated_manifests())
def _fuzz_default(blob):
    _fuzz(blob, _FUZZ_SEEN)


@settings(max_examples=10_000, **_FUZZ_SETTINGS)
@given(mutated_manifests())
def _fuzz_slow(blob):
    _fuzz(blob, _FUZZ_SEEN_SLOW)


def test_fuzz_manifest_parser(fault):
    _FUZZ_SEEN.clear()
    _fuzz_default()
    n = sum(_FUZZ_SEEN.values())
    assert n >= 300 and _FUZZ_SEEN.get("rejected")
    fault(
        "hostile",
        "hypothesis fuzz of manifest.parse, rootreader.read_manifest and load",
        cases=n,
        detail=", ".join(f"{k} {v}" for k, v in sorted(_FUZZ_SEEN.items())),
    )


@pytest.mark.slow
def test_fuzz_manifest_parser_10000(fault):
    _FUZZ_SEEN_SLOW.clear()
    _fuzz_slow()
    n = sum(_FUZZ_SEEN_SLOW.values())
    assert n >= 10_000
    fault(
        "hostile",
        "hypothesis fuzz of manifest.parse, rootreader.read_manifest and load (slow run)",
        cases=n,
        detail=", ".join(f"{k} {v}" for k, v in sorted(_FUZZ_SEEN_SLOW.items())),
    )

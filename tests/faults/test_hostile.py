"""Hostile input: crafted manifests, markers and values, and a hypothesis fuzz of the parser.

A crafted checkpoint is self-consistent (its commit marker carries the crafted manifest's
checksum), so only validation stands between it and the reader. Every case must end in a
clean CheckpointError (or a load of harmless data) before any read outside the root, any large
allocation or any code execution: reads are recorded at the filesystem, allocations traced,
and pickles carry a payload that would create a file if ever unpickled. The hypothesis fuzz of
the manifest parser is in test_fuzz_manifest.py.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import tracemalloc

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer, CheckpointError
from ckptflow.steps.checkpoint.safe_value import UnsafeValueError, decode_value, encode_value

from ckptflow.core import codec, layout
from ckptflow.core.storage import Storage
from tests.core.test_codec import zstd_bomb
from tests.faults.harness import MAX_PEAK, ReadRecordingFS
from tests.steps import ckpt_helpers as h


class Payload:
    """Unpickling this creates a file: the proof that a pickle was executed."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _state() -> dict:
    return {"w": torch.arange(64.0).reshape(8, 8), "ids": torch.arange(10), "cfg": {"lr": 0.5}}


def _target() -> dict:
    return {"w": torch.zeros(8, 8), "ids": torch.zeros(10, dtype=torch.int64), "cfg": {"lr": None}}


@pytest.fixture
def crafted(tmp_path):
    """A root with a committed step 1, a file outside it, and a pickle marker path."""
    root = tmp_path / "root" / "ckpt"
    Checkpointer(str(root)).save(1, _state())
    outside = tmp_path / "outside"
    (outside / "objects" / "ab").mkdir(parents=True)
    (outside / "secret").write_bytes(b"secret")
    return str(root), str(outside), str(tmp_path / "pwned")


def _load_guarded(root: str, outside: str, marker: str):
    """Load step 1 through a recording filesystem; return (error or None, loaded target)."""
    fs = ReadRecordingFS()
    ck = Checkpointer("unused", storage=Storage(root, fs=fs), threads=1)
    target = _target()
    tracemalloc.start()
    try:
        ck.load(target, step=1)
        err = None
    except CheckpointError as exc:
        err = exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < MAX_PEAK, f"{peak / 2**20:.0f} MiB allocated"
    outside_reads = [p for p in fs.paths if not os.path.abspath(p).startswith(root)]
    assert not outside_reads, f"read outside the root: {outside_reads}"
    assert not os.path.exists(marker), "a pickle was executed"
    return err, target


def _part(m: dict, fqn: str = "w@0,0") -> dict:
    """The item's first part, as its own object (its span of a pack dropped): every forgery
    here plants an object of its own for it."""
    part = m["items"][fqn]["parts"][0]
    part.pop("span", None)
    return part


def _k(m: dict) -> str:
    return _part(m)["object"]


# Each mutation returns nothing; it edits the manifest in place.
MUTATIONS = {
    "object key with ../": lambda m, o: _part(m).update(object="../../../outside/secret"),
    "absolute object key": lambda m, o: _part(m).update(object=f"{o}/secret"),
    "objects table key with ../": lambda m, o: m["objects"].update({"../../outside": {"size": 1}}),
    "delta base pointing outside": lambda m, o: _part(m).update(
        base={
            "object": "/etc/passwd",
            "stored_size": 1,
            "raw_size": 256,
            "width": 4,
            "planes": [["raw", 1]],
        }
    ),
    "huge object size": lambda m, o: m["objects"][_k(m)].update(size=1 << 62),
    "negative object size": lambda m, o: m["objects"][_k(m)].update(size=-1),
    "huge raw size": lambda m, o: _part(m).update(raw_size=1 << 43),
    "huge value size": lambda m, o: _part(m, "cfg.lr").update(raw_size=1 << 40),
    "huge tensor shape": lambda m, o: m["tensors"]["w"].update(size=[1 << 40, 1 << 40]),
    "negative shape": lambda m, o: m["tensors"]["w"].update(size=[-8, 8]),
    "chunk outside the tensor": lambda m, o: m["tensors"]["w"]["chunks"][0].update(offsets=[4, 0]),
    "planes that do not add up": lambda m, o: _part(m).update(planes=[["raw", 3]]),
    "unknown codec": lambda m, o: _part(m)["planes"][0].__setitem__(0, "pickle"),
    "unknown dtype": lambda m, o: m["tensors"]["w"].update(dtype="object"),
    "dtype of the wrong type": lambda m, o: m["tensors"]["w"].update(dtype=["float32"]),
    "step as a string": lambda m, o: m.update(step="1"),
    "objects as a list": lambda m, o: m.update(objects=[]),
    "parts as an object": lambda m, o: m["items"]["w@0,0"].update(parts={}),
    "base as a number": lambda m, o: _part(m).update(base=5),
    "delta kind on a full part": lambda m, o: _part(m).update(delta="sub"),
    "delta kind of a wrong type on a full part": lambda m, o: _part(m).update(delta={"$eval": 1}),
    "chunks of numbers": lambda m, o: m["tensors"]["w"].update(chunks=[1, 2]),
    "planner data of numbers": lambda m, o: m.update(planner_data={"w": 5}),
    "unknown format version": lambda m, o: m.update(format_version=max(layout.READ_VERSIONS) + 1),
    "version as a float": lambda m, o: m.update(format_version=1.0),
    "version as a boolean": lambda m, o: m.update(format_version=True),
    "version as a string": lambda m, o: m.update(format_version="1"),
    "not a ckptflow manifest": lambda m, o: m.update(format="torch-dcp"),
    "world size 0": lambda m, o: m.update(world_size=0),
    "missing items": lambda m, o: m.pop("items"),
}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_hostile_manifest_is_refused_cleanly(crafted, name, fault):
    root, outside, marker = crafted
    st = Storage(root)
    h.rewrite_manifest(st, 1, lambda m: MUTATIONS[name](m, outside))
    err, _ = _load_guarded(root, outside, marker)
    assert err is not None, f"{name}: a crafted manifest was loaded"
    commit = json.loads(st.read(layout.commit_path(1)))
    assert commit["manifest"] in str(err) or "manifest" in str(err), str(err)
    with pytest.raises(CheckpointError):
        Checkpointer(root).verify(1)
    fault("hostile", f"crafted, self-consistent manifest: {name}", detail="refused cleanly")


def _plant_value(st: Storage, payload: bytes) -> None:
    key = codec.digest(payload)
    st.write(layout.object_path(key), payload)

    def plant(m):
        _part(m, "cfg.lr").update(
            object=key,
            stored_size=len(payload),
            raw_size=len(payload),
            planes=[["raw", len(payload)]],
            width=1,
            base=None,
        )
        m["objects"][key] = {"size": len(payload)}

    h.rewrite_manifest(st, 1, plant)


PICKLES = {
    "pickle as a value file": lambda mk: pickle.dumps({"lr": Payload(mk)}),
    "pickle inside a safe-encoding tag": lambda mk: json.dumps(
        {
            "$": "ckptflow-value-v1",
            "v": {"$pickle": base64.b64encode(pickle.dumps(Payload(mk))).decode()},
        }
    ).encode(),
    "object-dtype numpy array": lambda mk: json.dumps(
        {
            "$": "ckptflow-value-v1",
            "v": {
                "$ndarray": ["object", [1], base64.b64encode(pickle.dumps(Payload(mk))).decode()]
            },
        }
    ).encode(),
    "torch.save file as a value": lambda mk: _torch_save(Payload(mk)),
}


def _torch_save(obj) -> bytes:
    import io

    buf = io.BytesIO()
    torch.save({"x": obj}, buf)
    return buf.getvalue()


@pytest.mark.parametrize("name", list(PICKLES))
def test_pickle_payloads_are_never_executed(crafted, name, fault):
    root, outside, marker = crafted
    _plant_value(Storage(root), PICKLES[name](marker))
    err, _ = _load_guarded(root, outside, marker)
    assert err is not None and "cfg.lr" in str(err), str(err)
    fault("hostile", f"{name}", detail="refused, never unpickled")


def test_pickle_bytes_in_metadata_and_bytes_values_stay_bytes(crafted, fault):
    """A pickle carried as data (user metadata, a bytes value) is data: loaded, never run."""
    root, outside, marker = crafted
    evil = pickle.dumps(Payload(marker))
    st = Storage(root)
    h.rewrite_manifest(st, 1, lambda m: m["metadata"].update(note=evil.decode("latin-1")))
    _plant_value(st, encode_value(evil))
    err, target = _load_guarded(root, outside, marker)
    assert err is None and target["cfg"]["lr"] == evil
    assert Checkpointer(root).manifest(1)["metadata"]["note"] == evil.decode("latin-1")
    fault(
        "hostile",
        "pickle bytes in user metadata and in a bytes value",
        cases=2,
        detail="kept as inert bytes",
    )


@pytest.mark.parametrize("what", ["manifest", "commit marker", "root marker", "DCP .metadata"])
def test_pickle_instead_of_a_json_file(crafted, what, fault):
    root, outside, marker = crafted
    st = Storage(root)
    evil = pickle.dumps(Payload(marker))
    commit = json.loads(st.read(layout.commit_path(1)))
    rel = {
        "manifest": f"{layout.step_dir(1)}/{commit['manifest']}",
        "commit marker": layout.commit_path(1),
        "root marker": layout.ROOT_MARKER,
        "DCP .metadata": f"{layout.step_dir(1)}/.metadata",
    }[what]
    st.write(rel, evil)
    if what == "manifest":  # consistent marker: the parser itself must refuse it
        commit["manifest_xxh3"] = codec.digest(evil)
        st.write(layout.commit_path(1), json.dumps(commit).encode())
    err, target = _load_guarded(root, outside, marker)
    if what == "DCP .metadata":  # never read: the load is the real data
        assert err is None and torch.equal(target["w"], _state()["w"])
    elif what == "root marker":  # the steps agree on the root id: they stay loadable
        assert err is None and torch.equal(target["w"], _state()["w"])
        _assert_root_changes_refused(root)
    else:
        assert err is not None, what
    fault(
        "hostile",
        f"a pickle in place of the {what}",
        detail={
            "DCP .metadata": "ignored",
            "root marker": "never unpickled; steps load by the id they agree on, saves refused",
        }.get(what, "refused, never unpickled"),
    )


def _assert_root_changes_refused(root: str) -> None:
    """A damaged root marker is never replaced by a fresh id over the steps (issue 14.1)."""
    before = sorted(e.path for e in Storage(root).walk())
    with pytest.raises(CheckpointError, match="root marker"):
        Checkpointer(root).save(2, _state())
    assert sorted(e.path for e in Storage(root).walk()) == before


@pytest.mark.parametrize(
    "marker_field", ["save_id", "manifest"], ids=["save_id with ../", "manifest name with ../"]
)
def test_commit_marker_paths_cannot_escape(crafted, marker_field, fault):
    root, outside, marker = crafted
    st = Storage(root)
    commit = json.loads(st.read(layout.commit_path(1)))
    commit[marker_field] = "../../../outside/secret"
    st.write(layout.commit_path(1), json.dumps(commit).encode())
    err, _ = _load_guarded(root, outside, marker)
    if marker_field == "save_id":
        assert err is not None
    fault(
        "hostile",
        f"commit marker: {marker_field} = ../../../outside/secret",
        detail="refused" if err else "field unused: the manifest name derives from save_id",
    )


def test_safe_value_decoder_rejects_non_encodings():
    for blob in (
        pickle.dumps(1),
        b"\x80\x04K\x01.",
        b"{}",
        b'{"$":"ckptflow-value-v1","v":{"$x":1}}',
    ):
        with pytest.raises(UnsafeValueError):
            decode_value(blob)


ROOT_MARKERS = {
    "root marker without root_id": {"format": layout.ROOT_FORMAT, "version": 1},
    "root marker that is a list": [layout.ROOT_FORMAT],
    "root marker with a pickle as root_id": {
        "format": layout.ROOT_FORMAT,
        "version": 1,
        "root_id": base64.b64encode(pickle.dumps(os.getpid)).decode(),
    },
}


@pytest.mark.parametrize("name", list(ROOT_MARKERS))
def test_hostile_root_marker_is_refused_cleanly(crafted, name, fault):
    root, outside, marker = crafted
    Storage(root).write(layout.ROOT_MARKER, json.dumps(ROOT_MARKERS[name]).encode())
    err, target = _load_guarded(root, outside, marker)
    if "root_id" in ROOT_MARKERS[name]:  # a whole marker naming another id: the step is foreign
        assert err is not None and "another checkpoint root" in str(err)
    else:  # a damaged marker: the committed step names its root id and stays loadable
        assert err is None and torch.equal(target["w"], _state()["w"])
    _assert_root_changes_refused(root)  # and nothing changes the root either way
    fault("hostile", name, detail="marker refused; step loads by its own root id, saves refused")


def test_a_duplicated_chunk_is_refused_not_half_loaded(crafted, fault):
    """Chunks whose volumes add up but that overlap (here one chunk listed twice) would
    leave the rest of the tensor unwritten, silently: they must tile it exactly."""
    root, outside, marker = crafted
    st = Storage(root)
    half = _state()["w"][:4].contiguous().view(torch.uint8).numpy().tobytes()
    key = codec.digest(half)
    st.write(layout.object_path(key), half)

    def duplicate(m):
        m["tensors"]["w"]["chunks"] = [{"offsets": [0, 0], "sizes": [4, 8]}] * 2
        part = dict(_part(m), object=key, stored_size=len(half), raw_size=len(half))
        m["items"]["w@0,0"].update(sizes=[4, 8], parts=[dict(part, planes=[["raw", len(half)]])])
        m["objects"][key] = {"size": len(half)}

    h.rewrite_manifest(st, 1, duplicate)
    err, target = _load_guarded(root, outside, marker)
    assert err is not None and "chunks" in str(err), f"loaded: {target['w']}"
    fault("hostile", "a chunk listed twice (volumes add up, half the tensor unwritten)")


@pytest.mark.parametrize("where", ["cfg.lr", "w@0,0", "ids@0"])
def test_a_decompression_bomb_is_refused_before_allocating(crafted, where, fault):
    """A 32 KiB object whose zstd frame inflates to 1 GiB, planted for a part whose manifest
    declares a few bytes: decoding is bounded by the declared size (the guard checks that
    Python never allocates more than MAX_PEAK)."""
    root, outside, marker = crafted
    st = Storage(root)
    bomb = zstd_bomb(1 << 30)
    key = codec.digest(bomb)
    st.write(layout.object_path(key), bomb)

    def plant(m):
        part = _part(m, where)
        part.update(object=key, stored_size=len(bomb), width=1, planes=[["zstd", len(bomb)]])
        m["objects"][key] = {"size": len(bomb)}

    h.rewrite_manifest(st, 1, plant)
    err, _ = _load_guarded(root, outside, marker)
    assert err is not None and key in str(err), err
    fault("hostile", f"zstd bomb ({len(bomb)} bytes, 1 GiB inflated) as {where}")

"""Engine core on local disk and memory://: round trip, commit protocol, compression, integrity."""

from __future__ import annotations

import json
import pickle
import threading
import time

import numpy as np
import pytest
import torch
from ckptflow.steps.checkpoint import (
    Checkpointer,
    CheckpointError,
    CorruptCheckpoint,
    StateDictMismatch,
    StorageError,
)

from ckptflow.core import layout
from ckptflow.core.storage import Storage
from tests.steps import ckpt_helpers as h


@pytest.fixture(params=["local", "memory"])
def root(request, tmp_path):
    return str(tmp_path / "ckpt") if request.param == "local" else h.memory_root("core-test")


def test_round_trip_is_bitwise_with_safe_values(root):
    state = h.make_state()
    ck = Checkpointer(root)
    ck.save(5, state, metadata={"config": {"lr": 0.1}, "data_position": 123})
    target = h.zeros_like_state(state)
    assert ck.load(target) == 5
    h.assert_same(state, target)
    m = ck.manifest(5)
    assert m["metadata"] == {"config": {"lr": 0.1}, "data_position": 123}
    assert m["world_size"] == 1 and m["format_version"] == layout.FORMAT_VERSION
    assert m["library"]["ckptflow"]


def test_committed_latest_and_step_selection(root):
    ck = Checkpointer(root)
    for step in (10, 20, 30):
        ck.save(step, {"x": torch.full((8,), float(step))})
    assert ck.committed_steps() == [10, 20, 30] and ck.latest() == 30
    t = {"x": torch.zeros(8)}
    assert ck.load(t, step=20) == 20 and t["x"][0] == 20


def test_commit_order_data_then_manifest_then_marker_and_no_rename(tmp_path):
    st, fs = h.recording_storage(str(tmp_path / "r"))
    Checkpointer("unused", storage=st).save(1, h.make_state())
    kinds = [
        (
            "obj"
            if "/objects/" in p
            else "manifest"
            if "manifest-" in p
            else "commit"
            if p.endswith("/COMMIT")
            else "other"
        )
        for _, p in fs.events
        if "/events/" not in p  # the health event, written after the commit (core.health)
    ]
    assert kinds[-1] == "commit" and kinds.count("commit") == 1
    assert kinds[-2] == "manifest"
    assert "obj" in kinds and max(i for i, k in enumerate(kinds) if k == "obj") < kinds.index(
        "manifest"
    )


def test_uncommitted_step_is_invisible(root):
    ck = Checkpointer(root)
    ck.save(1, {"x": torch.ones(4)})
    ck.save(2, {"x": torch.full((4,), 2.0)})
    ck.storage.delete([layout.commit_path(2)])  # as if the marker was never written
    assert ck.committed_steps() == [1] and ck.latest() == 1
    t = {"x": torch.zeros(4)}
    assert ck.load(t) == 1 and t["x"][0] == 1
    with pytest.raises(CheckpointError, match="no committed checkpoint"):
        ck.load(t, step=2)


def test_saving_a_committed_step_is_refused(root):
    ck = Checkpointer(root)
    ck.save(3, {"x": torch.ones(4)})
    with pytest.raises(CheckpointError, match="already committed"):
        ck.save(3, {"x": torch.zeros(4)})
    t = {"x": torch.zeros(4)}
    ck.load(t, step=3)
    assert torch.equal(t["x"], torch.ones(4)), "the committed checkpoint must be untouched"


def test_compression_float_byte_grouping_and_raw_fallback(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"), compress=True)  # the codec's choices, not auto's
    g = torch.Generator().manual_seed(0)
    ck.save(
        1,
        {
            "w": torch.randn(256, 1024, generator=g) * 0.02,
            "noise": torch.randint(0, 256, (1 << 18,), dtype=torch.uint8, generator=g),
        },
    )
    m = ck.manifest(1)
    w_parts = m["items"]["w@0,0"]["parts"]
    assert w_parts[0]["width"] == 4 and len(w_parts[0]["planes"]) == 4
    assert [p[0] for p in w_parts[0]["planes"]][-1] == "zstd"  # sign+exponent bytes compress
    w_stored = sum(p["stored_size"] for p in w_parts)
    assert w_stored < 0.88 * 256 * 1024 * 4
    noise = m["items"]["noise@0"]["parts"][0]
    assert noise["planes"] == [["raw", 1 << 18]], "incompressible data is stored raw"


def test_compression_level_and_off(tmp_path):
    state = {"w": torch.randn(128, 128) * 0.02}
    off = Checkpointer(str(tmp_path / "off"), compress=False)
    off.save(1, state)
    assert off.manifest(1)["stats"]["stored_bytes"] == 128 * 128 * 4
    lvl = Checkpointer(str(tmp_path / "lvl"), compression_level=9)
    lvl.save(1, state)
    t = {"w": torch.zeros(128, 128)}
    lvl.load(t)
    assert torch.equal(t["w"], state["w"])


def test_large_tensor_is_split_into_parts_written_in_parallel(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"), part_mib=1, threads=4)
    w = torch.randn(1024, 1024)  # 4 MiB -> 4 parts
    ck.save(1, {"w": w})
    parts = ck.manifest(1)["items"]["w@0,0"]["parts"]
    assert len(parts) == 4 and [p["raw_offset"] for p in parts] == [0, 1 << 20, 2 << 20, 3 << 20]
    t = {"w": torch.zeros_like(w)}
    ck.load(t)
    assert torch.equal(t["w"], w)


class _ObjectWrites(Storage):
    """Counts the object writes started and in flight; the first `hold` wait until that many
    are in flight at once (10 s at most: then the write fails), `fail_at` (1-based) fails, and
    every other write takes `slow` seconds."""

    def __init__(self, uri: str, hold: int = 0, fail_at: int = 0, slow: float = 0.0):
        super().__init__(uri)
        self.barrier = threading.Barrier(hold) if hold else None
        self.hold, self.fail_at, self.slow = hold, fail_at, slow
        self.lock = threading.Lock()
        self.started = self.in_flight = self.most = 0

    def write(self, rel, data, **kw):
        if not rel.startswith("objects/"):
            return super().write(rel, data, **kw)
        with self.lock:
            self.started += 1
            n = self.started
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        try:
            if n == self.fail_at:
                time.sleep(0.2)  # the writer has moved on to its next parts meanwhile
                raise StorageError(f"{rel}: injected: no space left on device")
            if self.barrier is not None and n <= self.hold:
                self.barrier.wait(10)
            time.sleep(self.slow)
            return super().write(rel, data, **kw)
        finally:
            with self.lock:
                self.in_flight -= 1

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return self.started, self.in_flight


def test_a_writer_thread_encodes_its_next_part_while_its_last_one_is_written(tmp_path):
    """A thread that waited for each write before encoding again left the disk idle while
    it encoded and its core idle while it wrote (profiled on a 1 GiB save with 2 threads:
    each spent 0.70 s encoding and 0.80-0.93 s in writes, the storage busy 1.52 s of 1.82)."""
    st = _ObjectWrites(str(tmp_path / "r"), hold=2)
    ck = Checkpointer("unused", storage=st, part_mib=1, threads=1, compress=True)
    w = torch.randn(1024, 1024)  # 4 parts of 1 MiB, one writer thread
    ck.save(1, {"w": w})  # the first two writes only end once both are in flight
    assert st.most >= 2
    t = {"w": torch.zeros_like(w)}
    ck.load(t)
    assert torch.equal(t["w"], w)


def test_a_failed_object_write_fails_the_save_and_no_write_outlives_it(tmp_path):
    """Writes queued behind the failed one are not started and running ones have ended when
    the save raises: nothing of a failed save goes on writing while the caller handles it."""
    st = _ObjectWrites(str(tmp_path / "r"), fail_at=2, slow=0.1)
    ck = Checkpointer("unused", storage=st, part_mib=1, threads=2, compress=True)
    with pytest.raises(StorageError, match="no space left on device"):
        ck.save(1, {"w": torch.randn(4096, 1024)})  # 16 parts
    started, in_flight = st.counts()
    assert in_flight == 0 and started < 16
    time.sleep(0.5)
    assert st.counts() == (started, 0)  # no queued write started after the save returned
    assert not Storage(str(tmp_path / "r")).exists(layout.commit_path(1))


@pytest.mark.parametrize("uri", ["local", "memory"])
def test_auto_prices_a_local_save_as_written_behind_and_uploads_as_not(tmp_path, uri):
    """The adaptive codec's model must match the writer's pipeline (adaptive.save_seconds)."""
    import torch.distributed.checkpoint as dcp
    from ckptflow.steps.checkpoint.save_job import SaveJob
    from ckptflow.steps.checkpoint.writer import CkptStorageWriter, SafeSavePlanner

    from ckptflow.core import adaptive

    root = str(tmp_path / "r") if uri == "local" else h.memory_root("behind-policy")
    policy = adaptive.Policy(adaptive.Costs(), cores=2)
    st = Storage(root)
    job = SaveJob(st, 1, "0123456789abcdef", "r", 1, policy=policy, threads=2)
    state = {"w": torch.randn(1024, 1024)}
    dcp.save(state, storage_writer=CkptStorageWriter(job), planner=SafeSavePlanner(), no_dist=True)
    assert policy.overlapped is (uri == "local")
    assert st.exists(layout.commit_path(1))


def test_corrupt_object_detected_by_verify_and_load_names_file(root):
    ck = Checkpointer(root)
    state = {"w": torch.randn(64, 64)}
    ck.save(1, state)
    key = ck.manifest(1)["items"]["w@0,0"]["parts"][0]["object"]
    rel = layout.object_path(key)
    blob = bytearray(ck.storage.read(rel))
    blob[len(blob) // 2] ^= 0xFF
    ck.storage.write(rel, bytes(blob))
    with pytest.raises(CorruptCheckpoint) as ei:
        ck.verify(1)
    assert key in str(ei.value) and "checksum" in str(ei.value)
    with pytest.raises(CorruptCheckpoint, match=key):
        ck.load({"w": torch.zeros(64, 64)}, step=1)


def test_load_latest_falls_back_from_corrupt_newest(root):
    ck = Checkpointer(root)
    ck.save(1, {"w": torch.ones(32, 32)})
    ck.save(2, {"w": torch.full((32, 32), 2.0)})
    key = ck.manifest(2)["items"]["w@0,0"]["parts"][0]["object"]
    ck.storage.write(layout.object_path(key), b"garbage")
    t = {"w": torch.zeros(32, 32)}
    assert ck.load(t) == 1
    assert torch.equal(t["w"], torch.ones(32, 32))
    assert [s for s, _ in ck.last_load.fell_back_from] == [2]


def test_pickle_payload_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    root = str(tmp_path / "r")
    ck = Checkpointer(root)
    ck.save(1, {"w": torch.ones(4), "cfg": {"lr": 0.1}})
    evil = pickle.dumps({"lr": Payload()})
    key = __import__("ckptflow.core.codec", fromlist=["digest"]).digest(evil)
    ck.storage.write(layout.object_path(key), evil)

    def plant(m):
        part = m["items"]["cfg.lr"]["parts"][0]
        part.pop("span", None)  # its own object, not a share of the save's pack
        part.update(
            object=key, stored_size=len(evil), raw_size=len(evil), planes=[["raw", len(evil)]]
        )
        m["objects"][key] = {"size": len(evil)}

    h.rewrite_manifest(ck.storage, 1, plant)
    # A DCP-style pickled .metadata planted beside it is never read either.
    ck.storage.write(f"{layout.step_dir(1)}/.metadata", evil)
    with pytest.raises(CorruptCheckpoint, match="safe encoding"):
        Checkpointer(root).load({"w": torch.zeros(4), "cfg": {"lr": None}})
    assert not marker.exists()


def test_foreign_manifest_is_refused(tmp_path):
    a, b = Checkpointer(str(tmp_path / "a")), Checkpointer(str(tmp_path / "b"))
    a.save(1, {"w": torch.ones(4)})
    b.save(1, {"w": torch.ones(4)})
    commit = json.loads(b.storage.read(layout.commit_path(1)))
    foreign = b.storage.read(f"{layout.step_dir(1)}/{commit['manifest']}")
    a_commit = json.loads(a.storage.read(layout.commit_path(1)))
    a.storage.write(f"{layout.step_dir(1)}/{a_commit['manifest']}", foreign)
    a_commit["manifest_xxh3"] = __import__("ckptflow.core.codec", fromlist=["x"]).digest(foreign)
    a.storage.write(layout.commit_path(1), json.dumps(a_commit).encode())
    with pytest.raises(CorruptCheckpoint, match="another checkpoint root"):
        a.manifest(1)


def test_root_holding_something_else_is_refused(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "train.csv").write_text("a,b\n")
    with pytest.raises(CheckpointError, match="holds something else"):
        Checkpointer(str(tmp_path / "r")).save(1, {"x": torch.ones(2)})
    assert (tmp_path / "r" / "train.csv").read_text() == "a,b\n"


def test_missing_step_and_empty_root_messages(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"))
    with pytest.raises(CheckpointError, match="nothing to load"):
        ck.load({"x": torch.ones(2)})
    ck.save(1, {"x": torch.ones(2)})
    with pytest.raises(
        CheckpointError, match=r"step 9 has no committed checkpoint.*committed steps: \[1\]"
    ):
        ck.load({"x": torch.ones(2)}, step=9)


def test_bad_uri_is_a_clear_error():
    with pytest.raises(StorageError, match="unsupported storage URI"):
        Storage("ftp://host/x")


def test_escaping_paths_are_refused(tmp_path):
    st = Storage(str(tmp_path))
    with pytest.raises(StorageError, match="escapes"):
        st.path("../etc/passwd")


def test_numpy_and_nested_values_round_trip(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"))
    legacy = np.random.RandomState(3).get_state()  # a tuple holding an ndarray: one leaf
    state = {"np_rng": legacy, "gen": np.random.default_rng(0).bit_generator.state}
    ck.save(1, state)
    # Dicts are matched key by key (DCP flattens them), so the target mirrors their structure.
    target = {
        "np_rng": None,
        "gen": {
            k: ({kk: None for kk in v} if isinstance(v, dict) else None)
            for k, v in state["gen"].items()
        },
    }
    ck.load(target)
    assert target["gen"] == state["gen"]
    assert target["np_rng"][0] == "MT19937" and np.array_equal(target["np_rng"][1], legacy[1])


def test_torch_free_itemsize_table_matches_torch():
    # the validator's table (no torch) and the loader's dtypes must name the same sizes
    from ckptflow.steps.checkpoint import dcp_metadata

    from ckptflow.core import manifest as mf

    assert set(mf.ITEMSIZE) == set(dcp_metadata.DTYPES)
    for name, dtype in dcp_metadata.DTYPES.items():
        assert mf.ITEMSIZE[name] == torch.empty(0, dtype=dtype).element_size(), name


AWKWARD_FQNS = {
    "tensor a and value a@0": {"a": torch.arange(3.0), "a@0": 5},
    "tensor a and tensor a@0": {"a": torch.arange(3.0), "a@0": torch.ones(2)},
    "offsets in the name": {"w": torch.ones(2, 2), "w@0,0": "v", "w@0": torch.zeros(1)},
    "0-dim tensor s and value s@": {"s": torch.tensor(2.0), "s@": 3},
    "escape characters": {"%40": torch.ones(2), "@": torch.zeros(2), "%": 1, "%25": 2},
    "slashes, dots, unicode": {"a/b": torch.ones(2), "é.ü": {"ß": torch.zeros(3)}, "ключ": 7},
    "empty segments": {"": {"": torch.ones(2), "x": 1}, "y": {"": torch.zeros(1)}},
}


@pytest.mark.parametrize("name", list(AWKWARD_FQNS))
def test_every_fqn_round_trips(tmp_path, name):
    """Manifest keys are unambiguous for every FQN the planner makes (the save used to commit
    a manifest the load then refused)."""
    state = AWKWARD_FQNS[name]
    ck = Checkpointer(str(tmp_path / "r"))
    ck.save(1, state)
    target = h.zeros_like_state(state)
    assert ck.load(target) == 1
    h.assert_same(state, target)


def test_a_version_1_manifest_still_loads(tmp_path):
    """Version 1 keyed items `fqn@offsets` unescaped; such checkpoints still load."""
    state = {"a%b": torch.arange(4.0), "x@y": 3, "m": {"w": torch.ones(2, 2)}}
    ck = Checkpointer(str(tmp_path / "r"), pack_kib=0)  # version 1 had one object per part
    ck.save(1, state)

    def to_v1(m):
        m["format_version"] = 1
        m["items"] = {
            it["fqn"]
            if it["offset"] is None
            else f"{it['fqn']}@{','.join(map(str, it['offset']))}": it
            for it in m["items"].values()
        }

    h.rewrite_manifest(ck.storage, 1, to_v1)
    assert ck.manifest(1)["format_version"] == 1 and "a%b@0" in ck.manifest(1)["items"]
    target = h.zeros_like_state(state)
    ck.load(target)
    h.assert_same(state, target)


def test_dtype_mismatch_lists_every_difference_and_converts_nothing(tmp_path):
    """float64 -> float16 would give inf, float32 -> bool True: a mismatch is an error listing
    every (key, saved dtype, target dtype), as shapes are, unless a cast is asked for."""
    ck = Checkpointer(str(tmp_path / "r"))
    saved = {
        "x": torch.tensor([1e10, 0.5], dtype=torch.float64),
        "m": {"y": torch.tensor([0.0, 2.0]), "same": torch.ones(2)},
        "ids": torch.arange(3),
    }
    ck.save(1, saved)
    target = {
        "x": torch.zeros(2, dtype=torch.float16),
        "m": {"y": torch.zeros(2, dtype=torch.bool), "same": torch.zeros(2)},
        "ids": torch.zeros(3, dtype=torch.int32),
    }
    with pytest.raises(StateDictMismatch) as ei:
        ck.load(target)
    msg = str(ei.value)
    assert "3 dtype mismatch(es)" in msg and "cast=True" in msg, msg
    for key, was, now in [("x", "float64", "float16"), ("m.y", "float32", "bool")]:
        assert f"{key}: checkpoint {was}, model {now}" in msg, msg
    assert "ids: checkpoint int64, model int32" in msg and "m.same" not in msg, msg
    assert not target["x"].any() and not target["m"]["same"].any(), "nothing was loaded"
    assert ck.load(target, cast=True) == 1  # asked for: converted as torch converts
    assert torch.equal(target["ids"], saved["ids"].int()) and target["x"][0] == float("inf")


@pytest.mark.parametrize("block", [True, False], ids=["sync", "async"])
def test_a_conjugate_view_saves_its_values(tmp_path, block):
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    state = {"model": {"z": z.conj(), "neg": z.conj().imag}}
    ck = Checkpointer(str(tmp_path / "r"))
    ck.save(1, state, block=block).wait()
    target = {"model": {"z": torch.zeros(2, dtype=torch.complex64), "neg": torch.zeros(2)}}
    ck.load(target)
    assert torch.equal(target["model"]["z"], z.conj().resolve_conj())
    assert torch.equal(target["model"]["neg"], torch.tensor([-2.0, 4.0]))


UNSAVABLE = {
    "complex128 tensor": ({"model": {"z": torch.ones(2, dtype=torch.complex128)}}, "model.z"),
    "uint16 tensor": ({"u": torch.ones(2, dtype=torch.uint16)}, "u"),
    "sparse tensor": ({"model": {"s": torch.eye(3).to_sparse()}}, "model.s"),
    "meta tensor": ({"m": torch.empty(3, device="meta")}, "m"),
    "object value": ({"w": torch.ones(2), "cfg": {"fn": object()}}, "cfg.fn"),
}


@pytest.mark.parametrize("name", list(UNSAVABLE))
def test_an_unsavable_entry_is_refused_naming_its_key(tmp_path, name):
    state, key = UNSAVABLE[name]
    ck = Checkpointer(str(tmp_path / "r"))
    with pytest.raises(CheckpointError, match=f"'{key}'"):
        ck.save(1, state)
    assert ck.committed_steps() == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"part_mib": 0}, "part_mib"),
        ({"part_mib": -1}, "part_mib"),
        ({"part_mib": 1.5}, "part_mib"),
        ({"threads": 0}, "threads"),
        ({"compression_level": 23}, "compression_level"),
        ({"full_every": True}, "full_every"),
    ],
)
def test_bad_checkpointer_arguments_are_refused(tmp_path, kwargs, match):
    """part_mib=0 used to cut a 16 KiB tensor into 4,096 objects."""
    with pytest.raises(ValueError, match=match):
        Checkpointer(str(tmp_path / "r"), **kwargs)


@pytest.mark.parametrize("step", [2**62 + 1, -1, True, 1.0, "3"])
def test_a_step_no_reader_accepts_is_refused_before_anything_is_written(tmp_path, step):
    """A step of 2**62 + 1 used to commit, and its own reader refused it."""
    ck = Checkpointer(str(tmp_path / "r"))
    with pytest.raises(ValueError, match="step"):
        ck.save(step, {"x": torch.ones(2)})
    assert not (tmp_path / "r").exists()
    with pytest.raises(ValueError, match="step"):
        ck.load({"x": torch.ones(2)}, step=step)


def test_the_largest_step_round_trips(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"))
    ck.save(layout.MAX_STEP, {"x": torch.ones(2)})
    assert ck.load({"x": torch.zeros(2)}) == layout.MAX_STEP


def test_metadata_that_is_not_json_is_refused_before_anything_is_written(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"))
    with pytest.raises(CheckpointError, match="metadata"):
        ck.save(1, {"x": torch.ones(2)}, metadata={"when": object()})
    assert not (tmp_path / "r").exists()


def test_a_manifest_no_reader_accepts_is_never_committed(tmp_path):
    """The writer validates the manifest it built before claiming the commit marker (a save
    used to commit a manifest its load then refused)."""
    from ckptflow.steps.checkpoint.save_job import SaveJob
    from ckptflow.steps.checkpoint.writer import CkptStorageWriter
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata
    from torch.distributed.checkpoint.storage import WriteResult

    st = Storage(str(tmp_path / "r"))
    job = SaveJob(storage=st, step=1, save_id="0123456789abcdef", root_id="r", world_size=1)
    md = Metadata(state_dict_metadata={"v": BytesStorageMetadata()})  # a value without item
    with pytest.raises(CheckpointError, match="not committed"):
        CkptStorageWriter(job).finish(md, [[]])
    assert not st.exists(layout.commit_path(1))
    rec = {"fqn": "v", "offset": None, "parts": []}
    twice = [WriteResult(index=None, size_in_bytes=0, storage_data=rec)] * 2
    with pytest.raises(CheckpointError, match="share the manifest key"):
        CkptStorageWriter(job).finish(md, [twice])

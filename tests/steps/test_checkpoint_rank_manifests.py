"""Per-rank manifests (format 5, issue 36) end to end on gloo ranks: FSDP2 round trips bitwise,
each rank's load reading the step index and its own manifest only, resharding through the
merged manifest, damaged files named, format-4 steps beside them, GC and verify."""

from __future__ import annotations

import json
import os

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer, CorruptCheckpoint, rank_save

from ckptflow.core import layout, rootreader
from ckptflow.core.gc import gc
from ckptflow.core.storage import Storage
from tests.steps import distworkers as dw

EXTRA = {"step": 7, "sched": {"last_epoch": 7, "lrs": [0.1, 0.05]}, "data": (3, 1024)}


class CountingStorage(Storage):
    """A Storage that records the files it read (this rank's manifest reads)."""

    def __init__(self, uri: str):
        super().__init__(uri)
        self.reads: list[str] = []

    def read(self, rel: str, limit: int | None = None) -> bytes:
        self.reads.append(rel)
        return super().read(rel, limit)


def save_worker(rank, world, root, ref_path, manifests):
    model, opt = dw.build(True, seed=0)
    dw.train(model, opt, 3)
    sd = {**dw.sharded_state(model, opt), "extra": EXTRA, f"rng/rank{rank}": torch.ones(rank + 1)}
    Checkpointer(root, manifests=manifests).save(3, sd)
    ref = dw.full_state(model, opt)  # (collective: every rank)
    if rank == 0:
        torch.save(ref, ref_path)


def load_worker(rank, world, root, out_path):
    from torch.distributed.checkpoint.state_dict import set_state_dict

    model, opt = dw.build(True, seed=99)
    dw.train(model, opt, 1)
    sd = {**dw.sharded_state(model, opt), "extra": dw.extra_template()}
    st = CountingStorage(root)
    ck = Checkpointer(root, storage=st)
    step = ck.load(sd)
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    got = dw.full_state(model, opt)
    reads = [r.rsplit("/", 1)[-1] for r in st.reads if "/manifest-" in r]
    st.reads.clear()
    assert ck.latest() == step  # (a resume's first call)
    latest = [r.rsplit("/", 1)[-1] for r in st.reads if "/manifest-" in r]
    with open(f"{out_path}.{rank}.json", "w") as f:
        json.dump({"load": reads, "latest": latest}, f)
    if rank == 0:
        torch.save({"step": step, "state": got, "extra": sd["extra"]}, out_path)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Checkpoints written with per-rank manifests by 2 and by 4 FSDP2 ranks, and their
    reference full states."""
    out = {}
    for n in (2, 4):
        d = tmp_path_factory.mktemp(f"rank{n}")
        root, ref = str(d / "ckpt"), str(d / "ref.pt")
        dw.spawn(n, save_worker, root, ref, "rank")
        out[n] = (root, torch.load(ref))
    return out


def _assert_bitwise(got: dict, ref: dict) -> None:
    assert set(got) == set(ref)
    for k in ref:
        assert got[k].dtype == ref[k].dtype and torch.equal(got[k], ref[k]), k


def _save_id(root: str) -> str:
    return rootreader.read_commit(Storage(root), 3)["save_id"]


@pytest.mark.parametrize("n", [2, 4])
def test_round_trip_is_bitwise_and_each_rank_reads_the_index_and_its_own_manifest(
    saved, tmp_path, n
):
    root, ref = saved[n]
    save_id = _save_id(root)
    files = sorted(os.listdir(os.path.join(root, layout.step_dir(3))))
    assert [layout.rank_manifest_name(save_id, r) for r in range(n)] == [
        f for f in files if layout.RANK_MANIFEST_RE.match(f)
    ]
    assert rootreader.read_commit(Storage(root), 3)["format_version"] == 5
    out = str(tmp_path / "out.pt")
    dw.spawn(n, load_worker, root, out)
    res = torch.load(out)
    assert res["step"] == 3 and res["extra"] == EXTRA
    _assert_bitwise(res["state"], ref)
    for r in range(n):
        with open(f"{out}.{r}.json") as f:
            reads = json.load(f)
        # (the load of the newest step reads its manifest once: the index and its own; so
        # does `latest`)
        own = [layout.manifest_name(save_id), layout.rank_manifest_name(save_id, r)]
        assert reads == {"load": own, "latest": own}


def test_resharding_4_to_2_loads_bitwise_through_the_merged_manifest(saved, tmp_path):
    root, ref = saved[4]
    out = str(tmp_path / "out.pt")
    dw.spawn(2, load_worker, root, out)
    res = torch.load(out)
    _assert_bitwise(res["state"], ref)
    with open(f"{out}.0.json") as f:
        reads = json.load(f)
    save_id = _save_id(root)
    assert {layout.rank_manifest_name(save_id, r) for r in range(4)} <= set(reads["load"])


def test_merged_manifest_holds_every_rank_and_replicated_items_once(saved):
    root, _ = saved[4]
    m = Checkpointer(root).manifest(3)
    assert m["world_size"] == 4 and m["rank_manifests"] == 4 and m["format_version"] == 5
    assert {f"rng/rank{r}" for r in range(4)} <= set(m["tensors"])  # each rank's own
    assert {"extra.step", "extra.sched.last_epoch", "extra.data"} <= set(m["values"])
    assert len([k for k in m["items"] if k.startswith("extra.step")]) == 1


def test_a_process_without_distributed_loads_a_4_rank_save(saved):
    from torch.distributed.checkpoint.state_dict import set_state_dict

    root, ref = saved[4]
    model, opt = dw.build(False, seed=5)
    dw.train(model, opt, 1)
    sd = {**dw.sharded_state(model, opt), "extra": dw.extra_template()}
    assert Checkpointer(root).load(sd) == 3
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    _assert_bitwise(dw.full_state(model, opt), ref)


def test_a_damaged_rank_manifest_is_refused_naming_the_file(saved, tmp_path):
    import shutil

    root = str(tmp_path / "copy")
    shutil.copytree(saved[2][0], root)
    rel = os.path.join(root, layout.step_dir(3), layout.rank_manifest_name(_save_id(root), 1))
    with open(rel, "r+b") as f:
        f.seek(40)
        byte = f.read(1)
        f.seek(40)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(CorruptCheckpoint, match=r"r00001\.json: rank manifest checksum"):
        Checkpointer(root).manifest(3)
    with pytest.raises(CorruptCheckpoint, match=r"r00001\.json"):
        Checkpointer(root).verify(3)


def test_verify_and_gc_on_a_format_5_step_beside_a_format_4_one(saved, tmp_path):
    import shutil

    root = str(tmp_path / "copy")
    shutil.copytree(saved[2][0], root)
    ck = Checkpointer(root)
    ck.save(4, {"w": torch.arange(6.0)})  # one process: `auto` writes format 4
    assert "format_version" not in rootreader.read_commit(Storage(root), 4)
    assert ck.verify(3)["objects"] == len(ck.manifest(3)["objects"])
    report = gc(root, "last=2", apply=True, grace_s=0)
    assert report.delete_steps == [] and report.orphan_files == []
    assert ck.verify(3) and ck.verify(4)  # every object and rank manifest kept
    out = {"w": torch.zeros(6)}
    assert ck.load(out, step=4) == 4 and torch.equal(out["w"], torch.arange(6.0))
    gc(root, "last=1", apply=True, grace_s=0)  # now step 3 goes, with its rank manifests
    assert not os.path.exists(os.path.join(root, layout.step_dir(3)))
    assert ck.verify(4)


def test_auto_keeps_one_manifest_in_one_process_and_rank_forces_it(tmp_path):
    sd = {"w": torch.arange(4.0)}
    Checkpointer(str(tmp_path / "a")).save(1, sd)
    Checkpointer(str(tmp_path / "b"), manifests="rank").save(1, sd)
    assert "format_version" not in rootreader.read_commit(Storage(str(tmp_path / "a")), 1)
    assert rootreader.read_commit(Storage(str(tmp_path / "b")), 1)["format_version"] == 5
    with pytest.raises(ValueError, match="manifests must be"):
        Checkpointer(str(tmp_path / "c"), manifests="ranks")


def auto_worker(rank, world, root):
    model, opt = dw.build(True, seed=0)
    dw.train(model, opt, 1)
    Checkpointer(root).save(1, dw.sharded_state(model, opt))


def test_auto_writes_rank_manifests_from_two_ranks(tmp_path):
    """Per-rank manifests save and load faster than one manifest at every world size measured
    (4 to 64 ranks, docs/benchmarks.md "Scale"), so a default save of two ranks writes them."""
    root = str(tmp_path / "ckpt")
    dw.spawn(2, auto_worker, root)
    assert rootreader.read_commit(Storage(root), 1)["format_version"] == 5


def test_auto_chooses_by_world_size_replicated_bytes_and_what_the_save_needs(caplog):
    small = {"w": torch.zeros(4)}
    big = {"w": torch.empty(rank_save.AUTO_MAX_REPLICATED // 4 + 1)}  # fp32: one byte over
    assert not rank_save.choose("auto", 1, small, None)
    assert rank_save.choose("auto", 2, small, None)
    assert not rank_save.choose("auto", 2, big, None)  # a replicated model: W copies written
    assert rank_save.choose("rank", 2, big, None)
    with caplog.at_level("INFO", logger="ckptflow.checkpoint"):
        assert not rank_save.choose("auto", 8, small, "a delta save")
    assert "per-rank" not in caplog.text  # the default's choice: no line on every save
    assert not rank_save.choose("step", 8, small, None)


def test_an_on_commit_hook_falls_back_to_one_manifest_with_a_log_line(tmp_path, caplog):
    ran = []
    ck = Checkpointer(str(tmp_path / "d"), manifests="rank", on_commit=lambda *a: ran.append(1))
    with caplog.at_level("INFO", logger="ckptflow.checkpoint"):
        ck.save(1, {"w": torch.arange(4.0)})
    assert "format_version" not in rootreader.read_commit(ck.storage, 1) and ran == [1]
    assert "not per-rank manifests: on_commit" in caplog.text


def _three_steps(root: str) -> dict:
    """Steps 1-3 saved with per-rank manifests by one process: weights and optimizer state."""
    ck = Checkpointer(root, manifests="rank")
    states = {}
    for s in (1, 2, 3):
        states[s] = {
            "model": {"w": torch.full((8, 8), float(s))},
            "optim": {"v": torch.ones(64) * s},
        }
        ck.save(s, states[s])
    ck.close()
    return states


def test_slim_and_gc_of_a_format_5_step_keep_its_weights_loading(tmp_path):
    import time

    from ckptflow.core import slim

    root = str(tmp_path / "r")
    states = _three_steps(root)
    st = Storage(root)
    assert slim.slim_step(st, 1, ("model",), time.time()) is not None
    report = gc(root, "last=10", apply=True, grace_s=0, now=time.time() + 10)
    gone = sorted(u.rsplit("/", 1)[-1] for u in report.orphan_files)
    save_id = rootreader.read_commit(st, 1)["save_id"]  # the index and its rank manifest
    assert gone == [layout.rank_manifest_name(save_id, 0), layout.manifest_name(save_id)]
    out = {"model": {"w": torch.zeros(8, 8)}}
    ck = Checkpointer(root)
    assert ck.load(out, step=1) == 1 and torch.equal(out["model"]["w"], states[1]["model"]["w"])
    assert ck.verify(1) and ck.verify(3)


def test_archive_of_format_5_steps_copies_their_rank_manifests(tmp_path):
    import time

    from ckptflow.core.archive import archive

    root, arch = str(tmp_path / "hot"), str(tmp_path / "archive")
    states = _three_steps(root)
    report = archive(root, arch, 5.0, apply=True, now=time.time() + 10, grace_s=0)
    assert report.steps == [1, 2]
    save_id = rootreader.read_commit(Storage(arch), 1)["save_id"]
    assert os.path.exists(
        os.path.join(arch, layout.step_dir(1), layout.rank_manifest_name(save_id, 0))
    )
    ck = Checkpointer(root)
    out = {"model": {"w": torch.zeros(8, 8)}, "optim": {"v": torch.zeros(64)}}
    assert ck.load(out, step=1) == 1 and torch.equal(out["optim"]["v"], states[1]["optim"]["v"])
    assert ck.verify(1)


def test_an_async_save_with_rank_manifests_commits_and_loads(tmp_path):
    ck = Checkpointer(str(tmp_path / "a"), manifests="rank")
    state = {"w": torch.arange(12.0).reshape(3, 4), "meta": {"epoch": 2}}
    ck.save(5, state, block=False).wait()
    assert rootreader.read_commit(ck.storage, 5)["format_version"] == 5
    out = {"w": torch.zeros(3, 4), "meta": {"epoch": 0}}
    assert ck.load(out) == 5 and torch.equal(out["w"], state["w"]) and out["meta"]["epoch"] == 2
    ck.close()


def replicated_worker(rank, world, root):
    """Every rank saves the same plain tensors (replicated: each rank writes the same objects)."""
    sd = {f"rep{i}": torch.full((1 << 18,), float(i)) for i in range(24)}
    ck = Checkpointer(root, manifests="rank", compress=False)
    ck.save(1, sd)
    out = {k: torch.zeros(1 << 18) for k in sd}
    assert ck.load(out) == 1 and all(torch.equal(out[k], sd[k]) for k in sd)


def test_ranks_writing_the_same_replicated_objects_commit(tmp_path):
    # (a rank's check ran while another rank still wrote the same object: 0 bytes found)
    dw.spawn(4, replicated_worker, str(tmp_path / "r"))
    assert Checkpointer(str(tmp_path / "r")).verify(1)["objects"] >= 24

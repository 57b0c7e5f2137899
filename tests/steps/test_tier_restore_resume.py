"""state.resume through the local tier (issue 35), in one process: a local step newer than the
durable one resumes bitwise exactly (RNG included, loaded from the same piece), the recovery
is tagged with its source and the bytes read from object storage."""

from __future__ import annotations

import torch
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.checkpoint.tier.restore import TierSource
from ckptflow.steps.lib import state as st

from ckptflow.core import tier
from tests.steps import training_setup as ts
from tests.steps.tier_restore_workers import copy_piece

dinfo = ts.dinfo


class Lineage:
    def __init__(self):
        self.tags, self.metrics = {}, []

    def set_tags(self, tags):
        self.tags.update(tags)

    def log_metrics(self, metrics, step):
        self.metrics.append((step, metrics))


def _save(ck, setup, step):
    state = st.train_state(*setup, step=step)
    state.update(st.rng_entry(dinfo_rank := 0, torch.device("cpu")))
    ck.save(step, state, metadata={"world_size": 1}).wait()
    return dinfo_rank


def test_a_local_step_newer_than_the_durable_one_resumes_exactly(dinfo, tmp_path):
    reference = ts.make(dinfo)
    ts.steps(reference, 12, dinfo)

    first = ts.make(dinfo)
    ts.steps(first, 6, dinfo)
    durable = str(tmp_path / "ckpt")
    _save(Checkpointer(durable), first, 6)
    ts.steps(first, 2, dinfo)
    scratch = Checkpointer(str(tmp_path / "scratch"))
    _save(scratch, first, 8)  # the local save of step 8 (as its piece below)
    key = tier.run_key(Checkpointer(durable).root)
    local = str(tmp_path / "local")
    copy_piece(scratch.root, 8, 0, 1, tier.piece_root(local, key, 0))
    ts.steps(first, 2, dinfo)  # work after the checkpoint that the "kill" loses

    resumed = ts.make(dinfo)
    torch.manual_seed(1234)  # only the restored RNG can reproduce dropout
    lineage = Lineage()
    ck = Checkpointer(durable)
    found = st.restore_training(ck, resumed, dinfo, lineage, TierSource(local, key))
    assert (found.step, found.source) == (8, "local")
    assert found.store_bytes == 0  # the durable root listed, nothing read from it
    assert resumed[3].position == 8 * 4
    ts.steps(resumed, 4, dinfo)
    ref, got = ts.params(reference[0]), ts.params(resumed[0])
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    assert lineage.tags["ckptflow.resume_source"] == "local"
    assert lineage.tags["ckptflow.resumed_from_step"] == 8
    assert lineage.metrics == [
        (8, {"resume_store_bytes": found.store_bytes, "resume_from_local": 1})
    ]


def test_without_local_steps_resume_reads_the_store_and_counts_it(dinfo, tmp_path):
    first = ts.make(dinfo)
    ts.steps(first, 2, dinfo)
    durable = str(tmp_path / "ckpt")
    _save(Checkpointer(durable), first, 2)
    key = tier.run_key(Checkpointer(durable).root)
    lineage = Lineage()
    found = st.restore_training(
        Checkpointer(durable), ts.make(dinfo), dinfo, lineage, TierSource(str(tmp_path / "l"), key)
    )
    stored = Checkpointer(durable).manifest(2)["stats"]["stored_bytes"]
    assert (found.step, found.source) == (2, "store") and found.store_bytes >= stored
    assert lineage.metrics[0][1]["resume_from_store"] == 1
    assert (
        st.resume(
            Checkpointer(str(tmp_path / "none")),
            *ts.make(dinfo),
            dinfo,
            tier=TierSource(str(tmp_path / "l"), key),
        )
        == 0
    )


def test_a_damaged_local_step_is_skipped_named_and_tagged_and_the_store_restores(dinfo, tmp_path):
    first = ts.make(dinfo)
    ts.steps(first, 2, dinfo)
    durable = str(tmp_path / "ckpt")
    _save(Checkpointer(durable), first, 2)
    ts.steps(first, 2, dinfo)
    scratch = Checkpointer(str(tmp_path / "scratch"))
    _save(scratch, first, 4)
    key = tier.run_key(Checkpointer(durable).root)
    local = str(tmp_path / "local")
    root = tier.piece_root(local, key, 0)
    copy_piece(scratch.root, 4, 0, 1, root)
    piece = tier.read_piece(Checkpointer(root).storage, 4, 0)
    biggest = max(piece.objects, key=piece.objects.get)
    path = Checkpointer(root).storage.path(f"objects/{biggest[:2]}/{biggest}")
    with open(path, "r+b") as f:
        f.seek(3)
        f.write(b"\xde\xad")
    lineage = Lineage()
    found = st.restore_training(
        Checkpointer(durable), ts.make(dinfo), dinfo, lineage, TierSource(local, key)
    )
    assert (found.step, found.source) == (2, "store")  # never the damaged step 4
    assert path in lineage.tags["ckptflow.resume_skipped_local"]
    assert "checksum" in lineage.tags["ckptflow.resume_skipped_local"]

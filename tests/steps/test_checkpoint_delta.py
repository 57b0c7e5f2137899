"""Incremental (delta) and deduplicated checkpoints."""

from __future__ import annotations

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer, CorruptCheckpoint

from ckptflow.core import layout


def _adamw_like_update(state: dict, lr: float = 1e-4) -> None:
    g = torch.Generator().manual_seed(int(state["step"]))
    for k in ("w1", "w2"):
        state[k].add_(torch.randn(state[k].shape, generator=g) * lr)


def test_full_every_k_makes_deltas_against_the_last_full(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"), full_every=3)
    g = torch.Generator().manual_seed(0)
    state = {
        "w1": torch.randn(256, 256, generator=g) * 0.02,
        "w2": torch.randn(256, generator=g),
        "step": 0,
    }
    for step in range(1, 8):
        state["step"] = step
        _adamw_like_update(state)
        ck.save(step, state)
        t = {"w1": torch.zeros(256, 256), "w2": torch.zeros(256), "step": None}
        Checkpointer(str(tmp_path / "r")).load(t, step=step)
        assert torch.equal(t["w1"], state["w1"]) and t["step"] == step
    kinds = [(s, ck.manifest(s)["kind"], ck.manifest(s)["base_step"]) for s in range(1, 8)]
    assert kinds == [
        (1, "full", None),
        (2, "delta", 1),
        (3, "delta", 1),
        (4, "full", None),
        (5, "delta", 4),
        (6, "delta", 4),
        (7, "full", None),
    ]
    full, delta = ck.manifest(4)["stats"]["new_bytes"], ck.manifest(5)["stats"]["new_bytes"]
    # Dense updates of 0.5% flip the low 16 mantissa bits at random: about half the raw size.
    assert delta < 0.8 * full, (delta, full)


def test_sparse_updates_make_tiny_deltas(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"), full_every=5)
    state = {"emb": torch.randn(1000, 64)}
    ck.save(1, state)
    state["emb"][:10] += 0.01  # 1% of the rows trained, as for an embedding
    ck.save(2, state)
    full, delta = ck.manifest(1)["stats"]["new_bytes"], ck.manifest(2)["stats"]["new_bytes"]
    assert delta < 0.1 * full, (delta, full)
    t = {"emb": torch.zeros(1000, 64)}
    ck.load(t, step=2)
    assert torch.equal(t["emb"], state["emb"])


def test_needs_includes_the_base_and_a_corrupt_base_fails_the_delta(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"), full_every=10)
    state = {"w": torch.randn(128, 128)}
    ck.save(1, state)
    state["w"][0, :4] += 1.0
    ck.save(2, state)
    m2 = ck.manifest(2)
    base_key = m2["items"]["w@0,0"]["parts"][0]["base"]["object"]
    assert base_key in ck.needs(2) and base_key in ck.needs(1)
    ck.storage.write(layout.object_path(base_key), b"corrupt")
    with pytest.raises(CorruptCheckpoint, match=base_key):
        ck.load({"w": torch.zeros(128, 128)}, step=2)


def test_frozen_tensors_are_stored_once(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"))
    frozen = {f"layer{i}": torch.randn(128, 128) for i in range(19)}
    state = {**frozen, "head": torch.randn(128, 128)}
    ck.save(1, state)
    for step in (2, 3):
        state["head"].add_(0.01)
        ck.save(step, state)
    m1, m3 = ck.manifest(1), ck.manifest(3)
    assert m3["stats"]["new_bytes"] < 0.1 * m1["stats"]["new_bytes"]
    shared = set(m1["objects"]) & set(m3["objects"])
    assert len(shared) == 19, "every frozen layer references the same object"
    t = {k: torch.zeros(128, 128) for k in state}
    ck.load(t, step=3)
    assert all(torch.equal(t[k], state[k]) for k in state)


def test_dedup_survives_a_restart_via_load(tmp_path):
    state = {"frozen": torch.randn(256, 256), "head": torch.randn(8)}
    Checkpointer(str(tmp_path / "r")).save(1, state)
    ck = Checkpointer(str(tmp_path / "r"))  # a restarted job: load, then save
    ck.load({"frozen": torch.zeros(256, 256), "head": torch.zeros(8)})
    state["head"].add_(1)
    ck.save(2, state)
    assert ck.manifest(2)["stats"]["new_bytes"] < 1024

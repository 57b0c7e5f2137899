"""The local tier in a 2-rank pretrain run (steps/lib/loop.py, steps/lib/tier_loop.py, issue 35):
local saves every 2 steps, durable every 6 (drained from the local step), pieces complete for
both ranks, the durable steps as a run without the tier has them."""

from __future__ import annotations

import json
from pathlib import Path

from ckptflow.steps.checkpoint import Checkpointer

from ckptflow.core import health, rootreader, tier
from tests.steps.test_pretrain import blank_db, launch

ARGS = [
    "--model", "tiny", "--max-steps", "12", "--batch-size", "8", "--seq-len", "32",
    "--warmup-steps", "3", "--ckpt-every", "6", "--seed", "0", "--local-every", "2",
]  # fmt: skip


def test_a_two_rank_run_saves_locally_and_drains_its_durable_steps(tmp_path):
    root, local = str(tmp_path / "run"), str(tmp_path / "local")
    blank_db(str(tmp_path / "template"), root)
    assert launch(2, ["--run-root", root, *ARGS, "--local-dir", local]) == [0, 0]
    ck = Checkpointer(f"{root}/ckpt")
    assert ck.committed_steps() == [6, 12]
    for step in (6, 12):
        ck.verify(step)  # every byte against its manifest
        m = ck.manifest(step)
        assert m["world_size"] == 2 and m["metadata"]["data"]["position"] == step * 8
        assert m["metadata"]["mlflow"]["model_id"]  # a LoggedModel, as a direct save has
    # the durable steps came from the local tier: their manifests are the local ones' content
    key = tier.run_key(ck.root)
    pieces = tier.list_pieces(local, key)
    assert sorted((p.step, p.rank) for p in pieces) == [(10, 0), (10, 1), (12, 0), (12, 1)]
    for p in pieces:
        st = Checkpointer(p.root, cooperative=False).storage
        assert tier.verify_piece(st, p) is None
    local12 = rootreader.read_manifest(Checkpointer(pieces[-1].root).storage, 12)
    assert set(local12["objects"]) == set(ck.manifest(12)["objects"])
    # the durable saves were drains (save_kind "": not a full or delta serialization)
    saves = [e for e in health.read_events(ck.storage)[0] if e.kind == "save"]
    assert sorted((e.step, e.save_kind, e.outcome) for e in saves) == [
        (6, "", "ok"),
        (12, "", "ok"),
    ]
    assert json.loads(Path(f"{root}/FINISHED").read_text())["last_step"] == 12

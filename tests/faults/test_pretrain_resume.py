"""Pretraining resume after corruption: it falls back to the newest valid checkpoint, says so
in its log and in MLflow, and trains on to the end (slow: two real `ckptflow.steps.pretrain` runs)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from ckptflow.steps.checkpoint import Checkpointer
from mlflow import MlflowClient

from ckptflow.core import layout
from ckptflow.core.storage import Storage
from tests.faults import harness

ARGS = [
    "--model",
    "tiny",
    "--batch-size",
    "4",
    "--seq-len",
    "16",
    "--ckpt-every",
    "4",
    "--warmup-steps",
    "2",
    "--no-async-save",
    "--seed",
    "0",
]


def _pretrain(run_root: str, max_steps: int, log: str) -> int:
    from ckptflow.steps import pretrain

    def run():
        raise SystemExit(
            pretrain.main(["--run-root", run_root, "--max-steps", str(max_steps), *ARGS])
        )

    return harness.run_forked(harness.with_output_to, log, run, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["data file bit flip", "manifest deleted"])
def test_pretrain_resume_falls_back_past_a_corrupt_newest_checkpoint(tmp_path, damage, fault):
    run_root = str(tmp_path / "run")
    log = str(tmp_path / "pretrain.log")
    assert _pretrain(run_root, 8, log) == 0
    ck = Checkpointer(f"{run_root}/ckpt")
    assert ck.committed_steps() == [4, 8]
    st = Storage(f"{run_root}/ckpt")
    if damage == "data file bit flip":
        key = max(ck.manifest(8)["objects"].items(), key=lambda kv: kv[1]["size"])[0]
        if key in ck.needs(4):  # pick one that only step 8 has
            key = sorted(ck.needs(8) - ck.needs(4))[0]
        rel = layout.object_path(key)
        blob = bytearray(st.read(rel))
        blob[random.Random(0).randrange(len(blob))] ^= 0x10
        st.write(rel, bytes(blob))
    else:
        commit = json.loads(st.read(layout.commit_path(8)))
        st.delete([f"{layout.step_dir(8)}/{commit['manifest']}"])
    Storage(run_root).delete(["FINISHED"])
    Path(log).write_text("")
    assert _pretrain(run_root, 12, log) == 0
    text = Path(log).read_text()
    assert "falling back" in text and "resumed from step 4" in text, text[-3000:]
    assert Checkpointer(f"{run_root}/ckpt").committed_steps()[-1] == 12
    client = MlflowClient(tracking_uri=f"sqlite:///{run_root}/mlflow.db")
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        filter_string="tags.`ckptflow.resume_fell_back_from` = '8'",
    )
    assert runs, "the fallback is tagged on the resumed run"
    fault(
        "corruption",
        f"pretraining resume with a corrupt newest checkpoint ({damage})",
        detail="resumed from the newest valid step, logged and tagged in MLflow",
    )

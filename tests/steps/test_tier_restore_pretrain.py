"""A 2-rank pretrain run killed after a local step newer than its durable one resumes from the
local tier (issue 35; one node, so no replicas): the resumed run ends as an uninterrupted one, the recovery is recorded
with source `local` and nothing read from object storage, and MLflow tags the run."""

from __future__ import annotations

import json

import torch
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.lib.loop import KILLED_EXIT
from mlflow import MlflowClient

from ckptflow import cli
from ckptflow.core import tier
from tests.steps.test_pretrain import blank_db, final_state, launch

ARGS = [
    "--model", "tiny", "--max-steps", "12", "--batch-size", "8", "--seq-len", "32",
    "--warmup-steps", "3", "--ckpt-every", "6", "--seed", "0", "--local-every", "2",
    "--log-every", "1", "--preflight-factor", "0",
]  # fmt: skip


def test_a_killed_run_resumes_from_its_newer_local_step_and_ends_as_an_uninterrupted_one(
    tmp_path, capsys
):
    ref, root = str(tmp_path / "ref"), str(tmp_path / "run")
    blank_db(str(tmp_path / "template"), ref, root)
    assert launch(2, ["--run-root", ref, *ARGS, "--local-dir", str(tmp_path / "ref-local")]) == [
        0,
        0,
    ]
    local = str(tmp_path / "local")
    run = ["--run-root", root, *ARGS, "--local-dir", local]
    assert launch(2, [*run, "--fail-at-step", "11"]) == [KILLED_EXIT, KILLED_EXIT]
    ck = Checkpointer(f"{root}/ckpt")
    assert ck.committed_steps() == [6]  # durable; the local tier has newer steps
    # step 8 is complete (the local save of 10 waited for it); 10 may have been cut short
    pieces = tier.list_pieces(local, tier.run_key(ck.root))
    newest = max(
        s
        for s in {p.step for p in pieces}
        if {(s, 0), (s, 1)} <= {(p.step, p.rank) for p in pieces}
    )
    assert newest in (8, 10)
    assert launch(2, run) == [0, 0]

    got, want = final_state(root, 12), final_state(ref, 12)
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert cli.main(["ckpt", "stats", f"{root}/ckpt", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)["recoveries"]
    assert rec["by_source"] == {"local": 1, "peer": 0, "store": 0}, rec
    assert rec["store_bytes"] == 0 and rec["measured"][0]["resumed_step"] == newest
    client = MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    runs = client.search_runs(client.search_experiments()[0].experiment_id)
    tagged = [r for r in runs if r.data.tags.get("ckptflow.resume_source")]
    assert [
        (r.data.tags["ckptflow.resume_source"], r.data.tags["ckptflow.resumed_from_step"])
        for r in tagged
    ] == [("local", str(newest))]
    assert tagged[0].data.metrics["resume_from_local"] == 1

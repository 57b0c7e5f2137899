"""A rank pod deleted mid-training is retried by Argo and resumes from the latest valid
checkpoint; the workflow still succeeds."""

from __future__ import annotations

import time

import pytest

from tests.e2e.argo import (
    FINISHED,
    global_output,
    small_settings,
    submit,
    unique_root,
    wait_finished,
    workflow,
)
from tests.e2e.conftest import MLFLOW, kubectl, kubectl_json

# Up to 900 s for a commit, then 1,800 s for the end: beyond pytest's global 600 s.
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(3000)]


def _running_rank_pods(wf_name: str) -> list[str]:
    """Running pods of this workflow whose main container runs ckptflow.steps.pretrain."""
    pods = kubectl_json("get", "pods", "-l", f"workflows.argoproj.io/workflow={wf_name}")
    names = []
    for pod in pods["items"]:
        main = [c for c in pod["spec"]["containers"] if c["name"] == "main"]
        command = " ".join(main[0].get("command", []) + main[0].get("args", [])) if main else ""
        if "ckptflow.steps.pretrain" in command and pod["status"].get("phase") == "Running":
            names.append(pod["metadata"]["name"])
    return names


def test_deleted_rank_pod_is_retried_and_resumes(cluster, host_s3_env):
    from ckptflow.steps.checkpoint import Checkpointer
    from mlflow import MlflowClient

    run_root = unique_root("rank-kill")
    # Long enough to delete a rank after the first commit and before the end.
    settings = small_settings(run_root) + [
        f"pretrain.run_root={run_root}/pretrain",
        "pretrain.max_steps=400",
        "pretrain.ckpt_every=10",
    ]
    code, output, name = submit("pretrain", settings, wait=False, timeout_s=120)
    assert code == 0, output
    ck = Checkpointer(f"{run_root}/pretrain/ckpt")
    try:
        deadline = time.monotonic() + 900
        victim, before = None, None
        while victim is None:
            assert time.monotonic() < deadline, "no committed checkpoint while ranks ran"
            phase = workflow(name).get("status", {}).get("phase")
            assert phase not in FINISHED, f"{name} ended ({phase}) before a rank was deleted"
            ranks = _running_rank_pods(name)
            before = ck.latest()
            if ranks and before is not None:
                victim = ranks[-1]
            else:
                time.sleep(3)
        kubectl("delete", "pod", victim, "--wait=false")

        wf = wait_finished(name, timeout_s=1800)
        assert wf["status"]["phase"] == "Succeeded", wf["status"].get("message")
        nodes = wf["status"]["nodes"].values()
        retried = [n for n in nodes if n["type"] == "Retry" and len(n.get("children", [])) > 1]
        assert retried, "the deleted rank was not retried"
        final = ck.committed_steps()
    finally:
        ck.close()

    # The retried rank logged (as an MLflow tag) the step it resumed from: a valid checkpoint
    # no older than the newest one committed before the deletion.
    client = MlflowClient(tracking_uri=MLFLOW)
    parent = client.get_run(global_output(wf, "mlflow_run_id"))
    runs = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
    )
    resumed = [
        int(r.data.tags["ckptflow.resumed_from_step"])
        for r in runs
        if "ckptflow.resumed_from_step" in r.data.tags
    ]
    assert resumed, "no run recorded a resume"
    assert max(resumed) >= before, f"resumed from {resumed}, but step {before} was committed"
    assert set(resumed) <= set(final), "resumed from a step that is not a committed checkpoint"
    assert max(final) == 400

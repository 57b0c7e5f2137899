"""The whole pipeline on the k3d cluster: submitted through Hera, checked in MinIO and MLflow."""

from __future__ import annotations

import json

import pytest

from tests.e2e.argo import global_output, outputs, small_settings, submit, unique_root, workflow
from tests.e2e.conftest import MLFLOW

# The shared run waits up to 2,400 s (in the first test's setup): beyond pytest's global 600 s.
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(2700)]


@pytest.fixture(scope="module")
def pipeline(cluster):
    """One pipeline run, shared by the checks below: (exit code, output, workflow)."""
    code, output, name = submit(
        "pipeline", small_settings(unique_root("pipeline")), wait=True, timeout_s=2400
    )
    return code, output, workflow(name)


def test_workflow_succeeded(pipeline):
    code, output, wf = pipeline
    assert wf["status"]["phase"] == "Succeeded", wf["status"].get("message")
    assert code == 0, output
    assert f"/workflows/ckptflow/{wf['metadata']['name']}" in output  # the Argo UI link


def test_committed_checkpoints_are_in_minio_and_every_one_was_evaluated(pipeline, host_s3_env):
    from ckptflow.steps.checkpoint import Checkpointer

    from ckptflow.core.runroot import eval_path
    from ckptflow.core.storage import Storage

    _, _, wf = pipeline
    # Only rank 0 of a job writes outputs: the other ranks' ckpt_root is empty.
    roots = sorted({r for r in outputs(wf, "ckpt_root") if r})
    assert len(roots) >= 3, f"expected pretraining and 2 fine-tune roots, got {roots}"
    committed = {}
    for root in roots:
        ck = Checkpointer(root)
        try:
            committed[root] = ck.committed_steps()
            assert committed[root], f"no committed checkpoint under {root}"
            ck.verify(ck.latest())
        finally:
            ck.close()
    # Each evaluator reports the steps it evaluated, all of one root (the pretraining DAG's
    # background and final evaluators share its root's steps between them); together they
    # evaluated every committed step of that root, each with its eval.json beside it.
    evaluated = [s for s in (json.loads(v) for v in outputs(wf, "evaluated") if v) if s]
    assert evaluated, "no evaluator output"

    def all_evaluated(root: str) -> bool:
        return all(Storage(root).exists(eval_path(step)) for step in committed[root])

    for steps in evaluated:
        matching = [r for r, c in committed.items() if set(steps) <= set(c) and all_evaluated(r)]
        assert matching, f"evaluated {steps}: no root of theirs has every step evaluated"


def _descendants(client, experiment_id: str, run_id: str) -> list:
    found, frontier = [], [run_id]
    while frontier:
        parent = frontier.pop()
        children = client.search_runs(
            [experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'"
        )
        found += children
        frontier += [c.info.run_id for c in children]
    return found


def test_mlflow_holds_the_lineage_and_a_champion(pipeline):
    from mlflow import MlflowClient

    _, _, wf = pipeline
    client = MlflowClient(tracking_uri=MLFLOW)
    run_id = global_output(wf, "mlflow_run_id")
    parent = client.get_run(run_id)
    assert parent.info.run_name == wf["metadata"]["name"]  # what the Argo UI link searches
    assert parent.info.status == "FINISHED"
    runs = _descendants(client, parent.info.experiment_id, run_id)
    assert len(runs) >= 3, "pretraining and fine-tune runs nest under the parent run"
    lineage = {run_id} | {r.info.run_id for r in runs}

    (version,) = outputs(wf, "model_version")
    champions = []
    for model in client.search_registered_models():
        try:
            champions.append(client.get_model_version_by_alias(model.name, "champion"))
        except Exception:  # no champion alias on this model
            continue
    mine = [mv for mv in champions if mv.version == version and mv.run_id in lineage]
    assert mine, f"no champion version {version} from this pipeline's runs: {champions}"


def test_argo_ui_link_finds_the_run(pipeline):
    """The controller's link searches experiment `ckptflow` for a run named after the workflow."""
    from mlflow import MlflowClient

    from tests.e2e.conftest import kubectl

    _, _, wf = pipeline
    links = kubectl(
        "get",
        "configmap",
        "workflow-controller-configmap",
        "-o",
        "jsonpath={.data.links}",
        namespace="argo",
    )
    experiment = MlflowClient(tracking_uri=MLFLOW).get_experiment_by_name("ckptflow")
    assert (
        f"/#/experiments/{experiment.experiment_id}?workflowType=machine_learning&searchFilter="
        in links
    )
    found = MlflowClient(tracking_uri=MLFLOW).search_runs(
        [experiment.experiment_id],
        filter_string=f"attributes.run_name = '{wf['metadata']['name']}'",
    )
    assert [r.info.run_id for r in found] == [global_output(wf, "mlflow_run_id")]

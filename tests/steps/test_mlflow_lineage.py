"""MLflow 3 lineage as its UI reads it, checked in the store with MLflow's own client after the
steps ran (test_finetune's `finetuned` runs: pretrain, evaluate, fine-tunes; then select):

- the experiment is marked as model training, not GenAI (`mlflow.experimentKind`);
- each checkpoint is a LoggedModel that is an *output* of the run that saved it and an *input*
  of the runs that evaluated it, fine-tuned from it or selected it;
- evaluation metrics are linked to the model (`model_id`), so the model page shows them;
- the registered version is a loadable pyfunc LoggedModel, an output of select's run, whose
  inputs are the candidates' checkpoints;
- runs and models are named after what they are: no two alike.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
from ckptflow.steps import select
from ckptflow.steps.checkpoint import Checkpointer
from mlflow import MlflowClient

from ckptflow import env
from tests.steps.test_finetune import finetuned, mlflow_template  # noqa: F401


def model_ids(root: str) -> dict[int, str]:
    """step -> the LoggedModel id each committed checkpoint's manifest recorded."""
    ck = Checkpointer(f"{root}/ckpt")
    return {s: ck.manifest(s)["metadata"]["mlflow"]["model_id"] for s in ck.committed_steps()}


@pytest.fixture(scope="module")
def store(finetuned, tmp_path_factory):  # noqa: F811
    """The store after select chose between variants a and b."""
    out = tmp_path_factory.mktemp("lineage-select")
    argv = ["--candidates", f"{finetuned['a']},{finetuned['b']}", "--model-name", "m-lineage"]
    argv += ["--export-uri", str(out / "export"), "--output-dir", str(out / "o")]
    assert select.main(argv) == 0
    client = MlflowClient(tracking_uri=finetuned["db"], registry_uri=finetuned["db"])
    runs = client.search_runs([client.get_experiment_by_name("ckptflow").experiment_id])
    return {"client": client, "runs": runs, "chosen": (out / "o" / "chosen").read_text()}


def _run(store, name: str):
    found = [r for r in store["runs"] if r.info.run_name == name]
    assert len(found) == 1, (name, [r.info.run_name for r in store["runs"]])
    return store["client"].get_run(found[0].info.run_id)  # with inputs and outputs


def test_the_experiment_opens_as_model_training(store):
    exp = store["client"].get_experiment_by_name("ckptflow")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"


def test_checkpoints_are_outputs_of_their_run_and_inputs_of_their_users(store, finetuned):  # noqa: F811
    client = store["client"]
    pre = model_ids(finetuned["pre"])
    run = _run(store, "pretrain-pre")
    assert {o.model_id: o.step for o in run.outputs.model_outputs} == {m: s for s, m in pre.items()}
    ev = _run(store, "evaluate-pre")
    assert {i.model_id for i in ev.inputs.model_inputs} == set(pre.values())
    for name in ("a", "b"):
        ft = _run(store, f"finetune-{name}")
        own = model_ids(finetuned[name])
        assert {o.model_id for o in ft.outputs.model_outputs} == set(own.values())
        base = Checkpointer(f"{finetuned[name]}/ckpt").manifest(8)["metadata"]["base"]
        assert [i.model_id for i in ft.inputs.model_inputs] == [base["model_id"]]
        model = client.get_logged_model(own[8])
        assert model.source_run_id == ft.info.run_id
        assert model.params["base_model_id"] == base["model_id"]  # shown on the model's page
        assert {m.key for m in model.metrics} >= {"val_loss", "exact_match"}  # by model_id
    evaluated = client.get_logged_model(pre[12])
    assert {m.key for m in evaluated.metrics} >= {"val_loss", "exact_match"}


def test_the_version_is_a_loadable_model_made_from_the_chosen_checkpoint(store, finetuned):  # noqa: F811
    client = store["client"]
    mv = client.get_model_version_by_alias("m-lineage", "champion")
    chosen = client.get_logged_model(mv.tags["ckptflow.source_model_id"])
    assert chosen.tags["ckptflow.ckpt_uri"] == store["chosen"]
    sel = client.get_run(mv.tags["ckptflow.select_run_id"])
    # select's run: the candidates in (the chosen one among them), the pyfunc model out
    inputs = {i.model_id for i in sel.inputs.model_inputs}
    assert chosen.model_id in inputs and len(inputs) == 2
    model_id = mv.source.removeprefix("models:/")
    assert model_id in {o.model_id for o in sel.outputs.model_outputs}
    model = client.get_logged_model(model_id)
    assert mv.run_id == model.source_run_id == sel.info.run_id
    assert {"name": "m-lineage", "version": str(mv.version)} in json.loads(
        model.tags["mlflow.modelVersions"]
    )
    assert {m.key for m in model.metrics} >= {"val_loss", "exact_match"}  # the chosen step's
    with env.mlflow_default_store(finetuned["db"]):  # for the lookup only: MLflow exports it
        assert "python_function" in mlflow.models.get_model_info(mv.source).flavors


def test_runs_and_models_say_which_they_are(store):
    client = store["client"]
    # the fixture's steps, one run each, named by what they ran (other tests add their own
    # runs to this store; c was killed and resumed: two runs)
    names = [r.info.run_name for r in store["runs"]]
    for name in ("pretrain-pre", "evaluate-pre", "finetune-a", "finetune-b"):
        assert names.count(name) == 1, (name, names)
    exp = client.get_experiment_by_name("ckptflow").experiment_id
    models = [m.name for m in client.search_logged_models([exp])]
    ours = [n for n in models if n.startswith(("pretrain-pre-", "finetune-a-", "finetune-b-"))]
    assert len(ours) == len(set(ours)) == 2 + 2 + 2, models
    assert "finetune-a-step-00000008" in models and "pretrain-pre-step-00000012" in models


def test_a_report_is_logged(store, finetuned):  # noqa: F811
    sel = store["client"].get_run(
        store["client"]
        .get_model_version_by_alias("m-lineage", "champion")
        .tags["ckptflow.select_run_id"]
    )
    assert [a.path for a in store["client"].list_artifacts(sel.info.run_id)] == ["report.png"]
    assert Path(store["chosen"]).exists()


def test_each_training_run_has_its_corpus_as_a_dataset_input(store):
    for name, task in (("pretrain-pre", "add"), ("finetune-a", "rev"), ("finetune-b", "rev")):
        run = _run(store, name)
        assert run.data.params["task"] == task
        (inp,) = run.inputs.dataset_inputs
        assert inp.dataset.name == f"{task}-seed{run.data.params['seed']}"
        assert json.loads(inp.dataset.source)["tags"]["task"] == task
        assert inp.dataset.source_type == "code"
        assert {t.key: t.value for t in inp.tags} == {"mlflow.data.context": "training"}
    (inp,) = _run(store, "evaluate-pre").inputs.dataset_inputs  # once for all its checkpoints
    assert inp.dataset.name == "add-seed0"
    assert {t.key: t.value for t in inp.tags} == {"mlflow.data.context": "evaluation"}

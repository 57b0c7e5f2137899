"""`ckptflow.steps.evaluate` beside a real 2-rank torchrun pretraining: every checkpoint exactly once.

Two evaluators follow the run at the same time as separate processes; the exclusive claim
decides which one evaluates each step. Lineage is checked with MLflow's own client.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from ckptflow.steps import evaluate, pretrain
from ckptflow.steps.checkpoint import Checkpointer, Storage
from mlflow import MlflowClient

from ckptflow.core.layout import object_path
from ckptflow.core.storage import AlreadyExists
from tests.steps.test_pretrain import pipeline_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """start_run, torchrun pretraining with two evaluators following it, finish_run (shared)."""
    return pipeline_run(tmp_path_factory)


def eval_record(root: str, step: int) -> dict:
    return json.loads(Path(f"{root}/ckpt/step-{step:08d}/eval.json").read_text())


def test_every_committed_step_is_evaluated_exactly_once(run):
    steps = Checkpointer(f"{run['root']}/ckpt").committed_steps()
    assert steps == [4, 8, 12, 16]
    a, b = run["evaluated"]
    assert sorted(a + b) == steps  # together all of them, and no step twice
    first, last = eval_record(run["root"], 4), eval_record(run["root"], 16)
    assert first["status"] == last["status"] == "ok"
    assert last["metrics"]["val_loss"] < first["metrics"]["val_loss"]  # training helps
    assert 0.0 <= last["metrics"]["exact_match"] <= 1.0
    best = Path(f"{run['base']}/eval0/best_step").read_text()
    losses = {s: eval_record(run["root"], s)["metrics"]["val_loss"] for s in steps}
    assert int(best) == min(losses, key=losses.get)


def test_eval_metrics_are_linked_to_each_checkpoint_model(run):
    client = MlflowClient(tracking_uri=f"sqlite:///{run['root']}/mlflow.db")
    parent = client.get_run(run["parent"])
    assert parent.info.status == "FINISHED"
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{run['parent']}'"
    )
    kinds = sorted(r.data.tags["ckptflow.step"] for r in children)
    assert kinds == ["evaluate", "evaluate", "pretrain"]
    models = client.search_logged_models(
        [parent.info.experiment_id],
        order_by=[{"field_name": "metrics.val_loss", "ascending": True}],
    )
    assert len(models) == 4
    for m in models:
        step = int(m.params["step"])
        rec = eval_record(run["root"], step)
        assert rec["model_id"] == m.model_id
        val = {x.key: x for x in m.metrics}["val_loss"]
        assert val.step == step and val.value == pytest.approx(rec["metrics"]["val_loss"])
    ranked = [int(m.params["step"]) for m in models]
    best = int(Path(f"{run['base']}/eval0/best_step").read_text())
    assert ranked[0] == best  # MLflow's models view ranks checkpoints by the metric


def test_single_step_is_idempotent_and_unknown_steps_are_refused(run, tmp_path):
    out = tmp_path / "o"
    assert evaluate.main(["--run-root", run["root"], "--step", "8", "--output-dir", str(out)]) == 0
    assert json.loads((out / "evaluated").read_text()) == []  # already done: not evaluated again
    assert evaluate.main(["--run-root", run["root"], "--step", "5"]) == 2


def test_a_corrupt_checkpoint_fails_its_evaluation_and_the_exit_code(run, tmp_path):
    root = str(tmp_path / "copy")
    shutil.copytree(run["root"], root, ignore=shutil.ignore_patterns("eval.*"))
    ck = Checkpointer(f"{root}/ckpt")
    own = ck.needs(12) - ck.needs(8) - ck.needs(16)
    items = ck.manifest(12)["items"].values()
    weights = sorted(
        p["object"] for it in items if it["fqn"].startswith("model.") for p in it["parts"]
    )
    path = f"{root}/ckpt/{object_path(next(k for k in weights if k in own))}"
    data = bytearray(Path(path).read_bytes())
    data[0] ^= 0xFF
    Path(path).write_bytes(bytes(data))
    assert evaluate.main(["--run-root", root, "--output-dir", str(tmp_path / "o")]) == 1
    assert eval_record(root, 12)["status"] == "failed"
    assert (
        "corrupt" in eval_record(root, 12)["error"].lower()
        or "checksum" in eval_record(root, 12)["error"]
    )
    assert eval_record(root, 16)["status"] == "ok"
    # a restarted evaluator evaluates nothing again, and still reports the failure
    assert evaluate.main(["--run-root", root, "--output-dir", str(tmp_path / "o2")]) == 1
    assert json.loads((tmp_path / "o2" / "evaluated").read_text()) == []


@pytest.mark.s3
def test_pretrain_and_evaluate_on_s3(s3_bucket, monkeypatch):
    """The same steps on an S3 root (moto): checkpoints, FINISHED, exclusive claims, eval.json."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # no local DB for an S3 root
    root = f"s3://{s3_bucket}/runs/r1"
    train = ["--max-steps", "4", "--ckpt-every", "2", "--batch-size", "4", "--seq-len", "16"]
    assert pretrain.main(["--run-root", root, *train, "--no-async-save"]) == 0
    args = [
        "--run-root",
        root,
        "--until-finished",
        "--poll-seconds",
        "0.1",
        "--timeout-seconds",
        "60",
    ]
    assert evaluate.main(args) == 0
    st = Storage(root)
    assert json.loads(st.read("FINISHED"))["last_step"] == 4
    for step in (2, 4):
        assert json.loads(st.read(f"ckpt/step-{step:08d}/eval.json"))["status"] == "ok"
    with pytest.raises(AlreadyExists):  # a second evaluator could not claim the step again
        st.write("ckpt/step-00000002/eval.claim", b"{}", exclusive=True)


def test_a_forever_evaluator_keeps_following_a_finished_run(tmp_path, monkeypatch):
    """The background evaluator is a daemon: Argo fails a daemon that exits by itself
    (workflow/controller/operator.go), so with --forever it polls on past FINISHED until its
    DAG stops it; --until-finished returns at once."""
    from ckptflow.steps import evaluate as ev_mod
    from ckptflow.steps.lib.lineage import Lineage

    from ckptflow.contract import EvaluateArgs
    from ckptflow.core import runroot
    from ckptflow.core.storage import Storage

    root = tmp_path / "run"
    root.mkdir()
    runroot.write_finished(Storage(str(root)), {"step": 0})
    done = ev_mod.Evaluator(
        EvaluateArgs(run_root=str(root), until_finished=True, poll_seconds=0.01), Lineage(None)
    )
    assert done.follow() is True
    polls = []

    class Stopped(Exception):
        pass

    def sleep(seconds):
        polls.append(seconds)
        if len(polls) == 3:
            raise Stopped  # the DAG ending stops it

    monkeypatch.setattr(ev_mod.time, "sleep", sleep)
    forever = ev_mod.Evaluator(
        EvaluateArgs(run_root=str(root), forever=True, poll_seconds=0.01, timeout_seconds=0),
        Lineage(None),
    )
    with pytest.raises(Stopped):
        forever.follow()
    assert polls == [0.01, 0.01, 0.01]

"""Step plumbing: the lifecycle every step runs in (`step_run`), against a real SQLite MLflow
store, and Argo output files."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import pytest
from ckptflow.steps import evaluate, finish_run, start_run
from ckptflow.steps.lib import plumbing
from mlflow import MlflowClient

from ckptflow.core.errors import CheckpointError
from tests.steps import test_lineage

log = logging.getLogger("ckptflow.toy")


@dataclass(frozen=True)
class ToyConfig:
    """The fields step_run reads from a step's config."""

    run_root: str
    experiment: str = "toy"
    mlflow_parent_run_id: str = ""
    output_dir: str = ""


blank_db, run_root = test_lineage.blank_db, test_lineage.run_root  # a fresh local store


@pytest.fixture
def cfg(run_root) -> ToyConfig:
    return ToyConfig(run_root=run_root, output_dir=f"{run_root}/out")


def runs_of(run_root: str, kind: str, experiment: str = "toy") -> list:
    c = MlflowClient(tracking_uri=f"sqlite:///{run_root}/mlflow.db")
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return c.search_runs([exp.experiment_id], filter_string=f"tags.`ckptflow.step` = '{kind}'")


def toy_step(cfg: ToyConfig, body, **kw) -> int:
    """A step's main(): its body inside step_run, the exit code read after."""
    with plumbing.step_run("toy", cfg, log, **kw) as run:
        body(run)
    return run.exit_code


def error_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_step_that_succeeds_ends_finished_with_its_outputs(cfg, tmp_path):
    def body(run):
        assert run.lineage.run_id
        run.outputs.update(answer=42, name="x")

    assert toy_step(cfg, body) == 0
    assert (tmp_path / "out" / "answer").read_text() == "42"
    assert (tmp_path / "out" / "name").read_text() == "x"
    (run,) = runs_of(cfg.run_root, "toy")
    assert run.info.status == "FINISHED" and run.info.run_name == "toy"
    assert run.data.params["run_root"] == cfg.run_root  # the config is the run's params


@pytest.mark.parametrize(
    "error",
    [
        plumbing.StepError("--x 7 is out of range: use 1 to 3"),
        ValueError("--x 7 is out of range: use 1 to 3"),
        CheckpointError("--x 7 is out of range: use 1 to 3"),
    ],
    ids=["StepError", "ValueError", "CheckpointError"],
)
def test_a_user_error_is_one_line_exit_2_and_a_failed_run(cfg, tmp_path, caplog, capsys, error):
    def body(run):
        run.outputs["answer"] = 42
        raise error

    assert toy_step(cfg, body) == plumbing.USER_ERROR_EXIT == 2
    (line,) = error_lines(caplog)
    assert line.getMessage() == "--x 7 is out of range: use 1 to 3"
    assert line.name == "ckptflow.toy" and line.exc_info is None  # no traceback
    assert "Traceback" not in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # a failed step writes no outputs
    (run,) = runs_of(cfg.run_root, "toy")
    assert run.info.status == "FAILED"


def test_a_step_error_chooses_its_exit_code(cfg, caplog):
    def body(run):
        raise plumbing.StepError("every candidate failed", exit_code=1)

    assert toy_step(cfg, body) == 1
    assert [r.getMessage() for r in error_lines(caplog)] == ["every candidate failed"]
    assert runs_of(cfg.run_root, "toy")[0].info.status == "FAILED"


def test_a_failed_outcome_still_writes_outputs(cfg, tmp_path):
    def body(run):
        run.outputs["evaluated"] = [4, 8]
        run.fail(1)  # e.g. an evaluation failed: recorded, reported, not raised

    assert toy_step(cfg, body) == 1
    assert json.loads((tmp_path / "out" / "evaluated").read_text()) == [4, 8]
    assert runs_of(cfg.run_root, "toy")[0].info.status == "FAILED"


def test_a_bug_propagates_with_its_traceback_and_fails_the_run(cfg, tmp_path):
    def body(run):
        raise KeyError("not a user error")

    with pytest.raises(KeyError):
        toy_step(cfg, body)
    assert runs_of(cfg.run_root, "toy")[0].info.status == "FAILED"
    assert not (tmp_path / "out").exists()


class Killed(plumbing.Abandon):
    exit_code = 75


@pytest.mark.parametrize("kill", ["Abandon", "SimulatedKill"])
def test_abandon_leaves_everything_as_a_kill_would(cfg, tmp_path, kill):
    from ckptflow.steps.lib.loop import KILLED_EXIT, SimulatedKill  # --fail-at-step, one process

    def body(run):
        run.outputs["answer"] = 42
        raise Killed() if kill == "Abandon" else SimulatedKill(3)

    assert toy_step(cfg, body) == KILLED_EXIT == 75
    assert runs_of(cfg.run_root, "toy")[0].info.status == "RUNNING"
    assert not (tmp_path / "out").exists()


def test_other_ranks_record_and_write_nothing(cfg, tmp_path, caplog):
    def body(run):
        assert run.lineage is None
        run.outputs["answer"] = 42

    assert toy_step(cfg, body, main=False) == 0
    assert not (tmp_path / "out").exists() and runs_of(cfg.run_root, "toy") == []

    def bad(run):
        raise ValueError("bad value")

    assert toy_step(cfg, bad, main=False) == 2  # every rank exits the same way
    assert [r.getMessage() for r in error_lines(caplog)] == ["bad value"]


def test_a_nested_run_takes_its_parent_and_params_from_the_config(cfg):
    def body(run):
        pass

    parent = ToyConfig(cfg.run_root)
    with plumbing.step_run("pipeline", parent, log, keep_open=True) as prun:
        pass
    child = ToyConfig(cfg.run_root, mlflow_parent_run_id=prun.lineage.run_id)
    assert toy_step(child, body, params={"only": 1}) == 0
    (run,) = runs_of(cfg.run_root, "toy")
    assert run.data.tags["mlflow.parentRunId"] == prun.lineage.run_id
    assert run.data.params == {"only": "1"}
    (open_parent,) = runs_of(cfg.run_root, "pipeline")
    assert open_parent.info.status == "RUNNING"  # keep_open: finish_run closes it


def test_start_run_and_finish_run_own_the_parent_run(cfg, tmp_path):
    out = tmp_path / "start"
    argv = ["--run-root", cfg.run_root, "--experiment", "toy", "--output-dir", str(out)]
    assert start_run.main(argv) == 0
    run_id = (out / "run_id").read_text()
    assert runs_of(cfg.run_root, "pipeline")[0].info.status == "RUNNING"
    argv = ["--run-id", run_id, "--status", "Failed", "--run-root", cfg.run_root]
    assert finish_run.main([*argv, "--output-dir", str(tmp_path / "fin")]) == 0
    (run,) = runs_of(cfg.run_root, "pipeline")
    assert run.info.status == "FAILED" and run.data.tags["ckptflow.workflow_status"] == "Failed"
    assert not (tmp_path / "fin").exists()  # finish_run has no outputs
    assert finish_run.main(["--run-id", "", "--run-root", cfg.run_root]) == 0  # nothing to close


def test_a_real_step_with_a_user_error(cfg, tmp_path, caplog, capsys):
    """evaluate --step of a step that is not committed: one line, exit 2, run FAILED."""
    out = tmp_path / "eval"
    argv = ["--run-root", cfg.run_root, "--output-dir", str(out)]
    assert evaluate.main([*argv, "--step", "5"]) == 2
    (line,) = error_lines(caplog)
    assert "step 5 is not committed" in line.getMessage() and "pick a committed step" in (
        line.getMessage()
    )
    assert "\n" not in line.getMessage() and "Traceback" not in capsys.readouterr().err
    assert not out.exists()
    (run,) = runs_of(cfg.run_root, "evaluate", "ckptflow")
    assert run.info.status == "FAILED"

    assert evaluate.main(argv) == 0  # nothing committed: nothing to do, and that is fine
    assert (
        json.loads((out / "evaluated").read_text()) == [] and (out / "best_step").read_text() == ""
    )
    statuses = sorted(r.info.status for r in runs_of(cfg.run_root, "evaluate", "ckptflow"))
    assert statuses == ["FAILED", "FINISHED"]


def test_write_outputs(tmp_path):
    plumbing.write_outputs(str(tmp_path / "o"), {"run_id": "abc", "evaluated": [1, 2]})
    assert (tmp_path / "o" / "run_id").read_text() == "abc"
    assert (tmp_path / "o" / "evaluated").read_text() == "[1, 2]"
    plumbing.write_outputs("", {"x": 1})  # no --output-dir: nothing to do


def test_the_fields_step_run_reads_are_the_contracts_field_names():
    """step_run reads its config's fields by name (getattr, with defaults): a field renamed in
    ckptflow.contract would silently start top-level runs or drop outputs. ToyConfig names
    what it reads; each step's arguments dataclass carries those it relies on."""
    from dataclasses import fields

    from ckptflow.contract import stepargs

    read = {f.name for f in fields(ToyConfig)}
    relied_on = {
        stepargs.PretrainArgs: read,
        stepargs.FinetuneArgs: read,
        stepargs.EvaluateArgs: read,
        stepargs.SelectArgs: read - {"run_root"},  # select passes run_root=tracking_root(cfg)
        stepargs.StartRunArgs: read - {"mlflow_parent_run_id"},  # it is the parent run
        stepargs.FinishRunArgs: {"run_root", "output_dir"},  # attaches to the parent run
    }
    for cls, names in relied_on.items():
        assert names <= {f.name for f in fields(cls)}, (cls.__name__, names)


def test_start_run_takes_argo_workflow_parameters_as_its_params():
    argo = (
        '[{"name":"ranks","value":"2","description":"rank pods"},{"name":"model","value":"tiny"}]'
    )
    assert start_run.config_params(argo) == {"ranks": "2", "model": "tiny"}
    assert start_run.config_params('{"lr": 0.001}') == {"lr": 0.001}
    with pytest.raises(ValueError):
        start_run.config_params("[1, 2]")
    with pytest.raises(SystemExit):
        start_run.parse_args(["--config-json", "[1]"])

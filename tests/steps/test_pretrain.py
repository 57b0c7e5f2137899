"""`ckptflow.steps.pretrain` on 2 CPU ranks: checkpoints, kill-and-resume equality, corrupt-latest fallback.

The uninterrupted reference is the pipeline run `pipeline_run` makes once per session (the real
torchrun command line, two evaluators beside it; `test_evaluate` checks those). The killed and
resumed runs fork their ranks, with torchrun's environment, from a fork server that imported
torch and the steps once (seconds instead of a torchrun start-up).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ckptflow.steps import finish_run, pretrain, start_run
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.lib.loop import KILLED_EXIT
from ckptflow.steps.lib.model import GPT, ModelConfig
from mlflow import MlflowClient
from mlflow.entities import LoggedModelStatus

from ckptflow.core import rootreader
from ckptflow.core.layout import object_path
from tests.steps import distworkers as dw

STEPS = 16
TRAIN = [
    "--model",
    "tiny",
    "--max-steps",
    str(STEPS),
    "--batch-size",
    "8",
    "--seq-len",
    "32",
    "--lr",
    "3e-3",
    "--warmup-steps",
    "3",
    "--grad-accum",
    "2",
    "--ckpt-every",
    "4",
    "--seed",
    "0",
    "--log-every",
    "1",
    # preflight has its own tests; here, on a loaded shared host, a rank measured 3.6x slower
    # at reading the store at random failed the resumed run (CI, fresh clone)
    "--preflight-factor",
    "0",
]


def _rank(rank: int, world: int, port: int, argv: list[str], stderr: str | None, environ, main):
    if stderr is not None:  # the fork server's stderr is whatever the first launch had
        fd = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
    dw.adopt_env(environ)  # and its environment too
    dw.rank_env(rank, world, port)
    dw.exit_with(main, argv)


def launch(
    world: int, argv: list[str], timeout: float = 240, stderr: str | None = None, main=None
) -> list[int]:
    """Run `python -m ckptflow.steps.pretrain ARGV` (or `main(ARGV)`) as `world` ranks (as
    torchrun would); exit codes.

    Ranks come from a fork server that imported this module (torch, mlflow, the steps) once:
    each launch costs a fork, not an interpreter start-up, and unlike a fork of the test
    process it inherits no threads (an in-process S3 server, a save worker) that could hang it.
    The fork server keeps the stderr and the environment of the test that started it: `stderr`,
    a file the ranks append their log to (capfd sees nothing of a later test's ranks); the
    ranks take this test's environment (`dw.adopt_env`).
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    port = dw.free_port()
    args = (world, port, argv, stderr, dict(os.environ), main or pretrain.main)
    procs = [ctx.Process(target=_rank, args=(r, *args)) for r in range(world)]
    return dw.run_all(procs, timeout)


MARK = "CKPTFLOW_TEST_LAUNCH_MARK"


def _report_mark(argv: list[str]) -> int:
    Path(f"{argv[0]}-{os.environ['RANK']}").write_text(os.environ.get(MARK, "<unset>"))
    return 0


def test_ranks_take_the_launching_tests_environment_not_the_fork_servers(tmp_path, monkeypatch):
    """A fork server's children inherit the environment it started with: the MLFLOW_TRACKING_URI
    of whichever test started it sent a later test's ranks' MLflow runs to that test's database
    (test_tier_restore_pretrain found no resume tags in its own)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    p = ctx.Process(target=os.getpid)  # the fork server is running before the mark is set
    p.start()
    p.join(240)
    monkeypatch.setenv(MARK, "the launching test's")
    assert launch(2, [str(tmp_path / "seen")], main=_report_mark) == [0, 0]
    seen = [Path(f"{tmp_path}/seen-{r}").read_text() for r in (0, 1)]
    assert seen == ["the launching test's"] * 2


def final_state(root: str, step: int = STEPS) -> dict:
    """Model and optimizer tensors of a step, loaded into one plain process."""
    ck = Checkpointer(f"{root}/ckpt")
    meta = ck.manifest(step)["metadata"]
    model = GPT(ModelConfig.from_dict(meta["model_config"]))
    state = {
        "model": model.state_dict(),
        "optim": {
            "state": {
                k: {"exp_avg": torch.zeros_like(v), "exp_avg_sq": torch.zeros_like(v)}
                for k, v in model.state_dict().items()
            }
        },
    }
    ck.load(state, step=step)
    return {f"model.{k}": v for k, v in state["model"].items()} | {
        f"optim.{k}.{n}": t for k, d in state["optim"]["state"].items() for n, t in d.items()
    }


def blank_db(template_dir: str, *roots: str) -> None:
    """Copy an initialised, empty MLflow DB into each run root: spares the schema migration.

    The template lives elsewhere, so no process holds a store for a run root's URI before
    the steps that use it start.
    """
    template = f"{template_dir}/mlflow.db"
    if not os.path.exists(template):
        MlflowClient(tracking_uri=f"sqlite:///{template}").search_experiments()
    for r in roots:
        os.makedirs(r, exist_ok=True)
        shutil.copy(template, f"{r}/mlflow.db")


_SHARED: dict = {}


def pipeline_run(tmp_path_factory) -> dict:
    """Once per session: start_run, `torchrun --nproc-per-node 2 -m ckptflow.steps.pretrain` with two
    `ckptflow.steps.evaluate --until-finished` processes following it, then finish_run."""
    if _SHARED:
        return _SHARED
    base = tmp_path_factory.mktemp("pipeline")
    root = str(base / "run")
    blank_db(str(base), root)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())
    assert (
        start_run.main(
            [
                "--experiment",
                "pipe",
                "--run-name",
                "wf-1",
                "--run-root",
                root,
                "--output-dir",
                f"{base}/start",
            ]
        )
        == 0
    )
    parent = Path(f"{base}/start/run_id").read_text()
    common = ["--run-root", root, "--mlflow-parent-run-id", parent]
    evaluators = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ckptflow.steps.evaluate",
                *common,
                "--until-finished",
                "--poll-seconds",
                "0.3",
                "--timeout-seconds",
                "400",
                "--output-dir",
                f"{base}/eval{i}",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    train = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "-m",
            "ckptflow.steps.pretrain",
            *common,
            *TRAIN,
            "--output-dir",
            f"{base}/out",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    logs = [p.communicate(timeout=400)[0] for p in evaluators]
    assert [p.returncode for p in evaluators] == [0, 0], "\n".join(x[-3000:] for x in logs)
    assert finish_run.main(["--run-id", parent, "--status", "Succeeded", "--run-root", root]) == 0
    _SHARED.update(
        root=root,
        base=str(base),
        parent=parent,
        evaluated=[json.loads(Path(f"{base}/eval{i}/evaluated").read_text()) for i in range(2)],
    )
    return _SHARED


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The reference pipeline run, and a run killed after step 10 then resumed on 2 ranks."""
    full = pipeline_run(tmp_path_factory)
    base = tmp_path_factory.mktemp("runs")
    killed = str(base / "killed")
    blank_db(full["base"], killed)
    assert (
        launch(2, ["--run-root", killed, *TRAIN, "--fail-at-step", "10", "--no-async-save"])
        == [KILLED_EXIT] * 2
    )
    copy = str(base / "killed-copy")
    shutil.copytree(killed, copy)
    assert launch(2, ["--run-root", killed, *TRAIN]) == [0, 0]
    return {
        "full": full["root"],
        "out": f"{full['base']}/out",
        "killed": killed,
        "copy": copy,
        "parent": full["parent"],
    }


def test_run_writes_checkpoints_outputs_and_finished(runs):
    root = runs["full"]
    ck = Checkpointer(f"{root}/ckpt")
    assert ck.committed_steps() == [4, 8, 12, 16]
    assert json.loads(Path(f"{root}/FINISHED").read_text())["last_step"] == STEPS
    assert Path(f"{runs['out']}/last_step").read_text() == str(STEPS)
    assert Path(f"{runs['out']}/ckpt_root").read_text() == f"{root}/ckpt"
    m = ck.manifest(12)
    assert m["world_size"] == 2
    meta = m["metadata"]
    assert meta["data"]["position"] == 12 * 8 and meta["config"]["max_steps"] == STEPS
    assert meta["metrics"]["train_loss"] > 0 and meta["model_config"]["n_layer"] == 2
    # every rank's RNG under its own key
    assert {"rng.rank0.torch", "rng.rank1.torch"} <= set(m["tensors"])
    assert {"rng.rank0.python", "rng.rank1.numpy"} <= set(m["values"])


def test_killed_run_left_no_finished_marker_and_resumed_from_a_checkpoint(runs):
    ck = Checkpointer(f"{runs['copy']}/ckpt")
    assert not os.path.exists(f"{runs['copy']}/FINISHED")
    assert ck.committed_steps() == [4, 8]  # steps 9 and 10 were lost with the kill
    assert os.path.exists(f"{runs['killed']}/FINISHED")


def test_resume_on_the_same_world_size_is_bitwise_identical(runs):
    ref, got = final_state(runs["full"]), final_state(runs["killed"])
    assert ref.keys() == got.keys()
    diff = [k for k in ref if not torch.equal(ref[k], got[k])]
    assert not diff, f"tensors differ after resume: {diff[:5]}"


def test_corrupt_latest_falls_back_and_resumes_into_one_rank(runs, caplog):
    root = runs["copy"]
    ck = Checkpointer(f"{root}/ckpt")
    latest, older = ck.committed_steps()[-1], ck.committed_steps()[-2]
    own = sorted(ck.needs(latest) - ck.needs(older))
    path = f"{root}/ckpt/{object_path(own[0])}"
    data = bytearray(Path(path).read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in an object only the newest step uses
    Path(path).write_bytes(bytes(data))

    assert pretrain.main(["--run-root", root, *TRAIN]) == 0  # one process: world size 1
    assert "falling back" in caplog.text or "corrupt" in caplog.text
    ref, got = final_state(runs["full"]), final_state(root)
    for k in ref:  # another world size reduces in another order: equal within tolerance
        torch.testing.assert_close(got[k], ref[k], rtol=1e-3, atol=1e-5, msg=k)

    client = MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    all_runs = client.search_runs([client.get_experiment_by_name("ckptflow").experiment_id])
    runs_ = [r for r in all_runs if "ckptflow.resume_fell_back_from" in r.data.tags]
    assert [r.data.tags["ckptflow.resume_fell_back_from"] for r in runs_] == [str(latest)]
    assert runs_[0].data.tags["ckptflow.resumed_from_step"] == str(older)


def test_lineage_of_the_run(runs):
    root = runs["full"]
    client = MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    exp = client.get_experiment_by_name("pipe")
    (run,) = client.search_runs(
        [exp.experiment_id], filter_string="tags.`ckptflow.step` = 'pretrain'"
    )
    assert run.data.tags["mlflow.parentRunId"] == runs["parent"]
    assert run.data.params["max_steps"] == str(STEPS) and run.data.params["world_size"] == "2"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")] == list(
        range(1, STEPS + 1)
    )
    saves = client.get_metric_history(run.info.run_id, "save_stall_s")
    assert [m.step for m in saves] == [4, 8, 12, 16]
    models = client.search_logged_models([exp.experiment_id])
    by_step = {int(m.params["step"]): m for m in models}
    assert sorted(by_step) == [4, 8, 12, 16]
    ck = Checkpointer(f"{root}/ckpt")
    for step, m in by_step.items():
        assert m.status == LoggedModelStatus.READY
        assert m.params["uri"] == f"{root}/ckpt/step-{step:08d}"
        assert (
            m.params["manifest_hash"] == rootreader.read_commit(ck.storage, step)["manifest_xxh3"]
        )
        assert int(m.params["stored_bytes"]) > 0
        assert ck.manifest(step)["metadata"]["mlflow"]["model_id"] == m.model_id


def test_bad_arguments_name_the_fix(capsys):
    with pytest.raises(SystemExit):
        pretrain.main(["--run-root", "/tmp/x", "--task", "poetry"])
    with pytest.raises(SystemExit):
        pretrain.main(["--run-root", "/tmp/x", "--max-steps", "0"])
    assert "--max-steps" in capsys.readouterr().err


def test_init_from_safetensors_starts_a_fresh_run_from_those_weights(tmp_path, runs):
    """--init-from: a fresh run's model starts from weights saved elsewhere (lr 0: the saved
    checkpoint holds exactly them); the manifest and the run say where they came from."""
    from ckptflow.steps.lib.model import config_for
    from safetensors.torch import save_file

    torch.manual_seed(123)
    src = {k: v.clone() for k, v in GPT(config_for("tiny", seq_len=32)).state_dict().items()}
    path = str(tmp_path / "w.safetensors")
    save_file(src, path)
    run = str(tmp_path / "run")
    blank_db(str(Path(runs["out"]).parent), run)  # the module's template DB: no migration
    argv = ["--run-root", run, "--model", "tiny", "--seq-len", "32", "--max-steps", "2"]
    argv += ["--ckpt-every", "2", "--lr", "0", "--batch-size", "4", "--init-from", path]
    assert launch(1, argv) == [0]
    ck = Checkpointer(f"{run}/ckpt")
    assert ck.committed_steps() == [2]
    assert ck.manifest(2)["metadata"]["init_from"] == {"uri": path, "state": "weights"}
    state = {"model": {k: torch.zeros_like(v) for k, v in src.items()}}
    ck.load(state, step=2)
    for k, v in src.items():
        assert torch.equal(state["model"][k], v), k

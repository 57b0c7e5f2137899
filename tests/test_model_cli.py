"""`ckptflow generate` / `ckptflow evaluate`: a checkpoint, its export and its registered MLflow
version (loaded with `mlflow.pyfunc.load_model`) answer a prompt with the same text; exact match
agrees with the training evaluator's; mistakes are one line, exit 2."""

from __future__ import annotations

import os
import re
import shutil

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.lib import generation, pyfunc_model, registry
from ckptflow.steps.lib.data import Corpus
from ckptflow.steps.lib.evaluation import evaluate
from ckptflow.steps.lib.export import export_weights
from ckptflow.steps.lib.model import GPT, config_for

from ckptflow import cli
from tests.steps.test_finetune import mlflow_template  # noqa: F401

PROMPTS = ["07+12=", "R12345=", "S31415="]


@pytest.fixture(scope="module")
def sources(tmp_path_factory, mlflow_template):  # noqa: F811
    """One tiny model as a checkpoint (step 8), an export folder and a registered champion."""
    tmp = tmp_path_factory.mktemp("model-cli")
    torch.manual_seed(3)
    model = GPT(config_for("tiny")).eval()
    root = str(tmp / "ckpt")
    with Checkpointer(root) as ck:
        ck.save(8, {"model": model.state_dict()}, metadata={"model_config": model.cfg.to_dict()})
    export = export_weights(model.state_dict(), model.cfg.to_dict(), str(tmp / "export")).uri
    shutil.copy(mlflow_template, tmp / "mlflow.db")
    db = f"sqlite:///{tmp}/mlflow.db"
    client = registry.client_for(db)
    exp = client.create_experiment("t", artifact_location=str(tmp / "mlartifacts"))
    run = client.create_run(exp).info.run_id
    mid = pyfunc_model.log(
        client, experiment_id=exp, run_id=run, name="tiny", export_uri=export, tags={}
    )
    registry.register(
        client, "m", source="", run_id=run, metric="x", value=1, mode="max", tags={}, model_id=mid
    )
    return {"model": model, "root": root, "export": export, "db": db}


def _cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_every_source_completes_a_prompt_the_same_way(sources, capsys):
    want = generation.complete(sources["model"], PROMPTS)
    flags = [a for p in PROMPTS for a in ("--prompt", p)]
    for source in (
        [sources["root"], "8"],
        [sources["export"]],
        ["models:/m@champion", "--tracking-uri", sources["db"]],
    ):
        code, out, err = _cli(capsys, "generate", *source, *flags)
        assert code == 0, err
        assert out.splitlines() == [p + w for p, w in zip(PROMPTS, want, strict=True)], source


def test_a_registered_source_leaves_mlflows_process_wide_store_as_it_was(
    sources, capsys, monkeypatch
):
    """Loading a models:/ source sets MLflow's process-wide URIs for the load only: MLflow
    writes them into os.environ, where they sent every later MLflow run of the process (and
    of the processes it starts) to this store instead of its own run root's."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")  # recorded, so teardown restores it
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", "")
    monkeypatch.delenv("MLFLOW_REGISTRY_URI")
    code, _, err = _cli(
        capsys, "generate", "models:/m@champion", "--tracking-uri", sources["db"], "--prompt", "1"
    )
    assert code == 0, err
    assert "MLFLOW_TRACKING_URI" not in os.environ and "MLFLOW_REGISTRY_URI" not in os.environ


def test_completions_stop_at_the_statement_end_or_the_budget(sources):
    out = generation.complete(sources["model"], PROMPTS, max_new_tokens=3)
    assert all(len(t) <= 3 for t in out)
    for t in generation.complete(sources["model"], PROMPTS, max_new_tokens=20):
        assert ";" not in t[:-1]  # nothing after the first `;`


def test_evaluate_agrees_with_the_training_evaluator(sources, capsys):
    ref = evaluate(sources["model"], Corpus("add", 0), seq_len=64, n_exact=64)["exact_match"]
    for source in ([sources["root"], "8"], ["models:/m/1", "--tracking-uri", sources["db"]]):
        code, out, err = _cli(capsys, "evaluate", *source, "--task", "add", "--show", "0")
        assert code == 0, err
        m = re.fullmatch(r"add: exact match (\S+) \((\d+)/64\)\n", out)
        assert m and float(m[1]) == pytest.approx(ref) and int(m[2]) == round(ref * 64), out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["generate", "models:/m@champion", "--prompt", "1"], "--tracking-uri"),
        (["generate", "ROOT", "--prompt", "1"], "give a STEP"),
        (["evaluate", "ROOT", "3", "--task", "add"], "ckpt-missing"),
        (["generate", "EXPORT", "--prompt", "hello"], "not in the vocabulary"),
    ],
)
def test_mistakes_are_one_line_and_exit_2(sources, capsys, monkeypatch, argv, says):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    argv = [sources["export"] if a == "EXPORT" else a for a in argv]
    argv = [sources["root"] + "-missing" if a == "ROOT" else a for a in argv]
    code, out, err = _cli(capsys, *argv)
    assert code == 2 and out == "", (out, err)
    assert len(err.strip().splitlines()) == 1 and says in err, err


def test_hf_export_writes_a_folder_transformers_loads(sources, capsys, tmp_path):
    transformers = pytest.importorskip("transformers")
    dest = str(tmp_path / "gpt2")
    code, out, err = _cli(capsys, "hf-export", sources["root"], "8", "--to", dest)
    assert code == 0 and dest in out, err
    hf = transformers.AutoModelForCausalLM.from_pretrained(dest).eval()
    ids = torch.randint(0, 17, (2, 16))
    with torch.no_grad():
        assert torch.allclose(hf(ids).logits, sources["model"](ids), atol=1e-5)
    code, out, err = _cli(capsys, "hf-export", sources["root"], "8", "--to", dest)
    assert code == 2 and "not empty" in err  # never over another export

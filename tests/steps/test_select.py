"""`ckptflow.steps.select`: the fan-in over the fine-tune variants of test_finetune's `finetuned` runs.

Select reads eval.json files from storage, skips failed variants, exports the winner to
safetensors (checked with `safetensors` itself against the checkpoint's weights) and registers
it; the aliases move only when a candidate beats the champion, or with --force.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import mlflow
import pytest
import torch
from ckptflow.steps import select
from ckptflow.steps.lib import generation
from mlflow import MlflowClient
from safetensors import safe_open

from ckptflow import env
from tests.steps.test_finetune import finetuned, load_state, mlflow_template  # noqa: F401


def best_of(root: str) -> tuple[float, int]:
    """(val_loss, step) of a variant's best evaluated step, read here independently."""
    found = []
    for name in os.listdir(f"{root}/ckpt"):
        path = f"{root}/ckpt/{name}/eval.json"
        if os.path.exists(path):
            rec = json.loads(Path(path).read_text())
            found.append((rec["metrics"]["val_loss"], rec["step"]))
    return min(found)


@pytest.fixture(scope="module")
def ranking(finetuned):  # noqa: F811
    a, b = best_of(finetuned["a"]), best_of(finetuned["b"])
    win, lose = ("a", "b") if a < b else ("b", "a")
    return {"win": win, "lose": lose, "a": a, "b": b}


def outputs(d) -> dict:
    return {n: Path(f"{d}/{n}").read_text() for n in os.listdir(d)}


def run_select(tmp_path, finetuned, names, model, *extra, tag="out"):  # noqa: F811
    out = tmp_path / tag
    argv = [
        "--candidates",
        ",".join(finetuned.get(n, n) for n in names),
        "--metric",
        "val_loss",
        "--mode",
        "min",
        "--export-uri",
        str(tmp_path / "export"),
        "--model-name",
        model,
        "--output-dir",
        str(out),
        *extra,
    ]
    return select.main(argv), out


def test_select_exports_and_registers_the_best_variant(tmp_path, finetuned, ranking):  # noqa: F811
    unfinished = tmp_path / "unfinished"  # a variant killed before its first checkpoint
    unfinished.mkdir()
    code, out = run_select(
        tmp_path, finetuned, ["a", str(unfinished), "b"], "m-best", "--dtype", "bf16"
    )
    assert code == 0
    o = outputs(out)
    win = finetuned[ranking["win"]]
    step = ranking[ranking["win"]][1]
    assert o["chosen"] == f"{win}/ckpt/step-{step:08d}"
    assert list(json.loads(o["failed"])) == [str(unfinished)]
    assert o["model_version"] == "1"

    # the export: readable by safetensors alone, the model config inside, the chosen weights
    path = f"{o['export_uri']}/model.safetensors"
    ref = load_state(f"{win}/ckpt", step)
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
        names = set(f.keys())
        assert names == {k.removeprefix("model.") for k in ref}
        for k in names:
            t = f.get_tensor(k)
            assert t.dtype == torch.bfloat16
            assert torch.equal(t, ref[f"model.{k}"].to(torch.bfloat16)), k
    cfg = json.loads(meta["model_config"])
    assert (
        cfg["n_layer"] == 2 and meta["dtype"] == "bf16" and meta["source_checkpoint"] == o["chosen"]
    )
    assert (
        json.loads(Path(f"{o['export_uri']}/config.json").read_text())["d_model"] == cfg["d_model"]
    )

    # the registered version names its source checkpoint, runs and data
    client = MlflowClient(tracking_uri=finetuned["db"], registry_uri=finetuned["db"])
    mv = client.get_model_version_by_alias("m-best", "champion")
    man = json.loads(Path(f"{win}/ckpt/step-{step:08d}/eval.json").read_text())
    run = client.get_run(mv.tags["ckptflow.select_run_id"])
    # registered from a loadable pyfunc LoggedModel, an output of select's run, which records
    # the version (the UI's link)
    assert str(mv.version) == "1" and mv.source.startswith("models:/m-")
    assert mv.run_id == run.info.run_id
    model_id = mv.source.removeprefix("models:/")
    logged = client.get_logged_model(model_id)
    assert logged.source_run_id == run.info.run_id and logged.model_type == "ckptflow-pyfunc"
    assert json.loads(logged.tags["mlflow.modelVersions"]) == [{"name": "m-best", "version": "1"}]
    assert logged.tags["ckptflow.source_model_id"] == man["model_id"]
    assert mv.tags["ckptflow.export_uri"] == o["export_uri"]
    assert mv.tags["ckptflow.source_checkpoint"] == o["chosen"]
    assert mv.tags["ckptflow.source_model_id"] == man["model_id"]
    assert mv.tags["ckptflow.source_run_id"] == man["mlflow_run_id"]
    assert json.loads(mv.tags["ckptflow.data"])["task"] == "rev"
    assert mv.tags["ckptflow.base_checkpoint"].startswith(f"{finetuned['pre']}/ckpt/step-")
    assert float(mv.tags["ckptflow.metric_value"]) == pytest.approx(ranking[ranking["win"]][0])
    assert run.data.tags["ckptflow.step"] == "select"
    # every usable candidate is an input of select (MLflow's lineage of the choice)
    cands = {
        json.loads(Path(f"{finetuned[n]}/ckpt/step-{ranking[n][1]:08d}/eval.json").read_text())[
            "model_id"
        ]
        for n in ("a", "b")
    }
    assert {m.model_id for m in run.inputs.model_inputs} == cands
    assert model_id in {m.model_id for m in run.outputs.model_outputs}

    # the champion loads through MLflow alone and completes prompts as the export does
    with env.mlflow_default_store(finetuned["db"]):  # for the load only: MLflow exports it
        champ = mlflow.pyfunc.load_model("models:/m-best@champion")
    prompts = ["R12345=", "R00017=", "07+12="]
    got = champ.predict(prompts)
    assert got == generation.complete(generation.load_export(o["export_uri"]), prompts)
    assert len(got) == 3 and all(isinstance(g, str) and g for g in got)
    assert champ.predict(["R12345="], params={"max_new_tokens": 2})[0] == got[0][:2]
    sig = champ.metadata.signature
    assert [i.type.name for i in sig.inputs.inputs] == ["string"]
    assert sig.params.params[0].name == "max_new_tokens"
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["report.png"]
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_aliases_move_only_for_a_better_candidate_or_force(tmp_path, finetuned, ranking):  # noqa: F811
    client = MlflowClient(tracking_uri=finetuned["db"], registry_uri=finetuned["db"])

    def aliases():
        return {
            a: str(client.get_model_version_by_alias("m-order", a).version)
            for a in ("champion", "fallback")
            if a in client.get_registered_model("m-order").aliases
        }

    lose, win = ranking["lose"], ranking["win"]
    assert run_select(tmp_path, finetuned, [lose], "m-order", tag="o1")[0] == 0
    assert aliases() == {"champion": "1"}  # no champion yet: the first one is
    assert run_select(tmp_path, finetuned, [lose, win], "m-order", tag="o2")[0] == 0
    assert aliases() == {"champion": "2", "fallback": "1"}  # better: promoted, old one falls back
    code, out = run_select(tmp_path, finetuned, [lose], "m-order", tag="o3")
    assert code == 0 and outputs(out)["model_version"] == "3"
    assert aliases() == {"champion": "2", "fallback": "1"}  # a worse rerun moves nothing
    assert client.get_model_version("m-order", "3").tags["ckptflow.promoted"] == "false"
    assert run_select(tmp_path, finetuned, [lose], "m-order", "--force", tag="o4")[0] == 0
    assert aliases() == {"champion": "4", "fallback": "2"}


def test_all_failed_variants_fail_with_their_causes(tmp_path, finetuned, caplog):  # noqa: F811
    missing = str(tmp_path / "never-ran")
    code, out = run_select(
        tmp_path, finetuned, [missing, finetuned["a"]], "m-none", "--metric", "bleu"
    )
    assert code == 1
    assert "every candidate failed" in caplog.text
    assert "never-ran" in caplog.text and "metrics found: exact_match, val_loss" in caplog.text
    assert not (tmp_path / "export").exists()


def test_bad_arguments():
    with pytest.raises(SystemExit):
        select.parse_args(["--candidates", "x", "--mode", "up"])
    with pytest.raises(SystemExit):
        select.parse_args(["--candidates", "x", "--dtype", "fp8"])
    with pytest.raises(SystemExit):
        select.parse_args(["--candidates", " , "])


def test_the_contract_offers_exactly_the_export_dtypes():
    from ckptflow.steps.lib.export import DTYPES

    from ckptflow.contract import SelectArgs, specs

    (dtype,) = (s for s in specs(SelectArgs) if s.name == "dtype")
    assert set(dtype.choices) == set(DTYPES)


def test_candidates_parent_star_names_each_variant_folder(tmp_path):
    for name in ("lr0.001-freeze1", "lr0.0003-freeze1"):
        (tmp_path / "finetune" / name / "ckpt").mkdir(parents=True)
    (tmp_path / "finetune" / "notes.txt").write_text("not a variant")
    got = select.candidate_uris(f"{tmp_path}/finetune/*,{tmp_path}/other")
    assert got == [
        f"{tmp_path}/finetune/lr0.0003-freeze1",
        f"{tmp_path}/finetune/lr0.001-freeze1",
        f"{tmp_path}/other",
    ]
    assert select.candidate_uris(f"{tmp_path}/nothing/*") == []

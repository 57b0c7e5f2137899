"""`ckptflow.steps.finetune`: a 4-rank pretraining checkpoint loaded into 2 and 1 workers, frozen tensors
deduplicated against the base, a task the base cannot do learned, exact resume, lineage.

Ranks are forked from the test process (torch already imported) with torchrun's environment,
running the steps' real `main(argv)`. The `finetuned` fixture (session scope) is shared with
test_select.py: pretrain (4 ranks), evaluate the base, variants `a` (2 ranks, FSDP2, best base
step) and `b` (1 process, replicated, latest base step), and `c` = `b` killed and resumed.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
from ckptflow.steps import evaluate, finetune, pretrain
from ckptflow.steps.checkpoint import Checkpointer, Storage
from ckptflow.steps.lib.loop import KILLED_EXIT
from ckptflow.steps.lib.model import GPT, ModelConfig
from mlflow import MlflowClient

from ckptflow.core import listing, rootreader
from ckptflow.core.layout import object_path
from tests.steps import distworkers as dw

PRE = [
    "--model",
    "tiny",
    "--max-steps",
    "12",
    "--batch-size",
    "8",
    "--seq-len",
    "32",
    "--lr",
    "3e-3",
    "--warmup-steps",
    "2",
    "--ckpt-every",
    "6",
    "--seed",
    "0",
]
FT = [
    "--task",
    "rev",
    "--max-steps",
    "8",
    "--ckpt-every",
    "4",
    "--batch-size",
    "8",
    "--seed",
    "1",
    "--eval-batches",
    "2",
    "--exact-match-n",
    "16",
]
A = ["--base-step", "best:val_loss", "--lr", "3e-3", "--freeze-blocks", "1"]
B = ["--base-step", "latest", "--lr", "1e-2", "--freeze-blocks", "2", "--parallel", "ddp"]


def _rank(main, rank: int, world: int, port: int, argv: list[str], environ: dict) -> None:
    dw.adopt_env(environ)  # this test's MLFLOW_TRACKING_URI, not the fork server's
    dw.rank_env(rank, world, port)
    dw.exit_with(main, argv)


def launch(main, world: int, argv: list[str], timeout: float = 240) -> list[int]:
    """Run a step's main(argv) as `world` ranks, as torchrun would; their exit codes."""
    # forkserver, not fork: forking the test process (with its moto, MLflow and torch threads)
    # can deadlock or crash the child.
    ctx = mp.get_context("forkserver")
    port = dw.free_port()
    env = dict(os.environ)
    procs = [
        ctx.Process(target=_rank, args=(main, r, world, port, argv, env)) for r in range(world)
    ]
    return dw.run_all(procs, timeout)


def _plain_target(main, argv: list[str], environ: dict) -> None:
    dw.adopt_env(environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(k, None)
    dw.exit_with(main, argv)


def _plain(main, argv: list[str]) -> int:
    """main(argv) in one child process without torchrun's environment (a plain step)."""
    p = mp.get_context("forkserver").Process(
        target=_plain_target, args=(main, argv, dict(os.environ))
    )
    return dw.run_all([p], 240)[0]


# Built once per session: test_select imports these fixtures, which pytest would run again.
_CACHE: dict = {}


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory) -> str:
    """An initialised, empty MLflow DB (the schema migration costs many seconds)."""
    if "template" not in _CACHE:
        d = tmp_path_factory.mktemp("mlflow-template")
        MlflowClient(tracking_uri=f"sqlite:///{d}/mlflow.db").search_experiments()
        _CACHE["template"] = str(d / "mlflow.db")
    return _CACHE["template"]


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, mlflow_template):
    """The runs every fine-tune and select test reads (see the module docstring).

    Built once (cached), but module-scoped so MLFLOW_TRACKING_URI is restored when the module
    ends: a session-wide setting would send later modules' MLflow calls to this database."""
    old = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        if "runs" not in _CACHE:
            _CACHE["runs"] = _build(tmp_path_factory.mktemp("ft"), mlflow_template)
        os.environ["MLFLOW_TRACKING_URI"] = _CACHE["runs"]["db"]  # one server for all, as in Argo
        yield _CACHE["runs"]
    finally:
        if old is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = old


def _build(base, template: str) -> dict:
    db = base / "mlflow.db"
    shutil.copy(template, db)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{db}"
    r = {k: str(base / k) for k in ("pre", "a", "b", "c")}
    r["db"] = os.environ["MLFLOW_TRACKING_URI"]
    assert launch(pretrain.main, 4, ["--run-root", r["pre"], *PRE]) == [0] * 4
    assert _plain(evaluate.main, ["--run-root", r["pre"]]) == 0
    common = ["--base-root", r["pre"], *FT]
    assert launch(
        finetune.main, 2, [*common, "--run-root", r["a"], *A, "--output-dir", f"{r['a']}/out"]
    ) == [0, 0]
    assert launch(finetune.main, 1, [*common, "--run-root", r["b"], *B]) == [0]
    killed = [*common, "--run-root", r["c"], *B, "--fail-at-step", "6", "--no-async-save"]
    assert launch(finetune.main, 1, killed) == [KILLED_EXIT]
    r["c_committed_at_kill"] = Checkpointer(f"{r['c']}/ckpt").committed_steps()
    assert launch(finetune.main, 1, [*common, "--run-root", r["c"], *B]) == [0]
    return r


def load_state(ckpt: str, step: int, optim: bool = False) -> dict[str, torch.Tensor]:
    """Model (and optimizer) tensors of a step, loaded into this one process."""
    ck = Checkpointer(ckpt)
    m = ck.manifest(step)
    model = GPT(ModelConfig.from_dict(m["metadata"]["model_config"]))
    state: dict = {"model": model.state_dict()}
    if optim:
        names = {
            k.removeprefix("optim.state.").rsplit(".", 1)[0]
            for k in m["tensors"]
            if k.startswith("optim.state.") and k.endswith(".exp_avg")
        }
        state["optim"] = {
            "state": {
                n: {
                    "exp_avg": torch.zeros_like(model.state_dict()[n]),
                    "exp_avg_sq": torch.zeros_like(model.state_dict()[n]),
                }
                for n in names
            }
        }
    ck.load(state, step=step)
    out = {f"model.{k}": v for k, v in state["model"].items()}
    for n, d in state.get("optim", {}).get("state", {}).items():
        out |= {f"optim.{n}.{k}": v for k, v in d.items()}
    return out


def test_outputs_finished_and_world_sizes(finetuned):
    a = finetuned["a"]
    assert Path(f"{a}/out/last_step").read_text() == "8"
    assert Path(f"{a}/out/ckpt_root").read_text() == f"{a}/ckpt"
    base = Checkpointer(f"{finetuned['pre']}/ckpt")
    assert base.committed_steps() == [6, 12] and base.manifest(12)["world_size"] == 4
    for name, world in (("a", 2), ("b", 1)):
        ck = Checkpointer(f"{finetuned[name]}/ckpt")
        assert ck.committed_steps() == [4, 8]
        assert ck.manifest(8)["world_size"] == world
        assert json.loads(Path(f"{finetuned[name]}/FINISHED").read_text())["last_step"] == 8


def test_base_step_resolution_latest_and_best(finetuned):
    evals = {
        s: json.loads(Path(f"{finetuned['pre']}/ckpt/step-{s:08d}/eval.json").read_text())
        for s in (6, 12)
    }
    best = min(evals, key=lambda s: evals[s]["metrics"]["val_loss"])
    meta_a = Checkpointer(f"{finetuned['a']}/ckpt").manifest(8)["metadata"]["base"]
    meta_b = Checkpointer(f"{finetuned['b']}/ckpt").manifest(8)["metadata"]["base"]
    assert (meta_a["step"], meta_a["selected_by"]) == (best, "best:val_loss:min")
    assert (meta_b["step"], meta_b["selected_by"]) == (12, "latest")


def test_frozen_tensors_equal_the_base_and_trainable_ones_moved(finetuned):
    base = load_state(f"{finetuned['pre']}/ckpt", 12)
    got = load_state(f"{finetuned['b']}/ckpt", 8)  # freeze 2 of 2 blocks: ln_f and head train
    trainable = {"model.ln_f.weight", "model.ln_f.bias", "model.head.weight"}
    for k in base:
        if k in trainable:
            assert not torch.equal(base[k], got[k]), k
        else:
            assert torch.equal(base[k], got[k]), k


def test_frozen_tensors_are_deduplicated_against_the_base(finetuned):
    pre = Checkpointer(f"{finetuned['pre']}/ckpt")
    base_step = Checkpointer(f"{finetuned['a']}/ckpt").manifest(8)["metadata"]["base"]["step"]
    base_objects = pre.needs(base_step)
    base_bytes = pre.manifest(base_step)["stats"]["stored_bytes"]
    for name in ("a", "b"):
        root = f"{finetuned[name]}/ckpt"
        ck = Checkpointer(root)
        marker = json.loads(Path(f"{root}/ckptflow-root.json").read_text())["parent"]
        assert marker["uri"] == f"{finetuned['pre']}/ckpt"
        for step in ck.committed_steps():
            m = ck.manifest(step)
            frozen = [
                p
                for k, it in m["items"].items()
                if k.startswith("model.blocks.0.") or k.startswith("model.tok_emb")
                for p in it["parts"]
            ]
            assert frozen and all(p["reused"] and p["object"] in base_objects for p in frozen)
            for p in frozen:  # referenced in the base root, not copied into this one
                assert not os.path.exists(f"{root}/{object_path(p['object'])}")
            fraction = m["stats"]["new_bytes"] / base_bytes
            print(
                f"variant {name} step {step}: stores {m['stats']['new_bytes']} bytes = "
                f"{fraction:.1%} of the base checkpoint's {base_bytes}"
            )
            assert fraction < 0.6
            assert ck.verify(step)["objects"] == len(m["objects"])  # reads through the parent
    # the catalog (and so GC) sees the borrowed objects as present, not as a corrupt step
    rows = listing.build_rows(Storage(f"{finetuned['a']}/ckpt"), now=0.0, check=True)
    assert [r.state for r in rows] == ["committed", "committed"]
    assert os.path.exists(f"{finetuned['pre']}/ckpt/step-{base_step:08d}/PIN")


def test_finetune_beats_the_base_on_its_task(finetuned):
    for name in ("a", "b"):
        rec = json.loads(Path(f"{finetuned[name]}/ckpt/step-00000008/eval.json").read_text())
        assert (
            rec["status"] == "ok"
            and rec["task"] == "rev"
            and rec["evaluator"] == "ckptflow.steps.finetune"
        )
        base_loss, loss = rec["base_metrics"]["val_loss"], rec["metrics"]["val_loss"]
        assert loss < 0.9 * base_loss, (name, loss, base_loss)


def test_resume_after_a_kill_is_exact(finetuned):
    assert finetuned["c_committed_at_kill"] == [4]
    ref = load_state(f"{finetuned['b']}/ckpt", 8, optim=True)
    got = load_state(f"{finetuned['c']}/ckpt", 8, optim=True)
    assert ref.keys() == got.keys() and any(k.startswith("optim.") for k in ref)
    diff = [k for k in ref if not torch.equal(ref[k], got[k])]
    assert not diff, f"tensors differ after resume: {diff[:5]}"
    assert os.path.exists(f"{finetuned['c']}/ckpt/step-00000004/eval.json")


def test_lineage_links_the_base_checkpoint_and_pretraining_run(finetuned):
    client = MlflowClient(tracking_uri=finetuned["db"])
    pre = Checkpointer(f"{finetuned['pre']}/ckpt")
    exp = client.get_experiment_by_name("ckptflow")
    all_runs = client.search_runs([exp.experiment_id])
    (pre_run,) = [r for r in all_runs if r.data.tags.get("ckptflow.step") == "pretrain"]
    (run,) = [
        r
        for r in all_runs
        if r.data.tags.get("ckptflow.step") == "finetune"
        and r.data.params.get("run_root") == finetuned["a"]
    ]
    ck = Checkpointer(f"{finetuned['a']}/ckpt")
    base = ck.manifest(8)["metadata"]["base"]
    base_meta = pre.manifest(base["step"])["metadata"]["mlflow"]
    assert run.data.tags["ckptflow.base_model_id"] == base_meta["model_id"]
    assert run.data.tags["ckptflow.base_run_id"] == base_meta["run_id"] == pre_run.info.run_id
    assert (
        run.data.tags["ckptflow.base_ckpt_uri"]
        == f"{finetuned['pre']}/ckpt/step-{base['step']:08d}"
    )
    inputs = client.get_run(run.info.run_id).inputs.model_inputs  # search_runs leaves them out
    assert [m.model_id for m in inputs] == [base_meta["model_id"]]
    models = [
        m
        for m in client.search_logged_models([exp.experiment_id])
        if m.source_run_id == run.info.run_id
    ]
    assert sorted(int(m.params["step"]) for m in models) == [4, 8]
    for m in models:
        step = int(m.params["step"])
        assert m.tags["ckptflow.base_model_id"] == base_meta["model_id"]
        assert ck.manifest(step)["metadata"]["mlflow"]["model_id"] == m.model_id
        ev = json.loads(Path(f"{finetuned['a']}/ckpt/step-{step:08d}/eval.json").read_text())
        assert ev["model_id"] == m.model_id
        linked = {x.key: x.value for x in client.get_logged_model(m.model_id).metrics}
        assert linked["val_loss"] == pytest.approx(ev["metrics"]["val_loss"])


def test_bad_base_step_names_the_fix(tmp_path, finetuned, caplog):
    argv = ["--base-root", finetuned["pre"], "--run-root", str(tmp_path / "x"), *FT]
    assert _plain(finetune.main, [*argv, "--base-step", "7"]) == 2
    assert _plain(finetune.main, [*argv, "--base-step", "best:bleu"]) == 2
    with pytest.raises(SystemExit):
        finetune.parse_args([*argv, "--task", "poetry"])
    assert not rootreader.committed_steps(Storage(str(tmp_path / "x" / "ckpt")))


# -- the engine side of fine-tuning: a root that borrows its base's objects (fast, one process) --
def _tensors(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "frozen": torch.randn(768, 1024, generator=g),  # 3 MiB: three 1 MiB base parts
        "trained": torch.randn(64, 64, generator=g),
    }


def test_inherit_deduplicates_across_part_sizes_and_roots_stay_self_consistent(tmp_path):
    from ckptflow.core import archive, gc

    base_root, ft_root = str(tmp_path / "base"), str(tmp_path / "ft")
    base = Checkpointer(base_root, part_mib=1)  # other parts than the fine-tune's 64 MiB ones
    base.save(5, {"model": _tensors(0)})
    ft = Checkpointer(ft_root)
    ft.inherit(base, 5)
    state = {"model": _tensors(0)}
    saved = {}
    for step in (1, 2, 3):
        state["model"]["trained"] += 1.0
        ft.save(step, state)
        saved[step] = {k: v.clone() for k, v in state["model"].items()}
    for step in (1, 2, 3):
        m = ft.manifest(step)
        frozen = m["items"]["model.frozen@0,0"]["parts"]
        assert len(frozen) == 3 and all(p["reused"] for p in frozen)
        assert m["stats"]["new_bytes"] < 0.01 * base.manifest(5)["stats"]["stored_bytes"]
    own = {p.name for p in (tmp_path / "ft" / "objects").rglob("*") if p.is_file()}
    assert not own & base.needs(5)  # nothing of the base was copied
    got = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}}
    Checkpointer(ft_root).load(got, step=3)  # a fresh reader finds the base through the marker
    assert all(torch.equal(got["model"][k], v) for k, v in saved[3].items())

    # GC of the fine-tune root neither sees its steps as corrupt nor touches the base
    report = gc.gc(ft_root, "last=2", apply=True, grace_s=0, now=time.time() + 60)
    assert report.delete_steps == [1] and Checkpointer(ft_root).verify(3)
    assert Checkpointer(base_root).verify(5)
    # archiving a fine-tune step copies the borrowed objects: the archive stands alone
    rep = archive.archive(
        ft_root, str(tmp_path / "cold"), 0.0, apply=True, grace_s=0, now=time.time() + 60
    )
    assert rep.steps == [2]
    cold = {p.name for p in (tmp_path / "cold" / "objects").rglob("*") if p.is_file()}
    assert base.needs(5) & ft.needs(2) <= cold
    got = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}}
    Checkpointer(ft_root).load(got, step=2)
    assert all(torch.equal(got["model"][k], v) for k, v in saved[2].items())


def test_inherit_refuses_a_root_of_another_base(tmp_path):
    from ckptflow.steps.checkpoint import CheckpointError

    base = Checkpointer(str(tmp_path / "base"))
    base.save(1, {"x": torch.ones(4)})
    base.save(2, {"x": torch.zeros(4)})
    ft = Checkpointer(str(tmp_path / "ft"))
    ft.inherit(base, 1)
    ft.save(1, {"x": torch.ones(4)})
    with pytest.raises(CheckpointError, match="created from .* step 1, not .* step 2"):
        Checkpointer(str(tmp_path / "ft")).inherit(base, 2)
    plain = Checkpointer(str(tmp_path / "plain"))
    plain.save(1, {"x": torch.ones(4)})
    with pytest.raises(CheckpointError, match="use a new root"):
        plain.inherit(base, 1)


def test_inherit_from_a_delta_base_references_the_delta_and_its_full_base(tmp_path):
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(256, 256, generator=g)
    # a small step apart, as training moves weights: a delta that pays (independent random
    # values are stored full since deltas are chosen per part by what they save)
    x1 = x0 + 1e-4 * torch.randn(256, 256, generator=g)
    base = Checkpointer(str(tmp_path / "base"), full_every=2)
    base.save(1, {"x": x0})
    base.save(2, {"x": x1})  # a delta against step 1
    assert base.manifest(2)["kind"] == "delta"
    ft = Checkpointer(str(tmp_path / "ft"))
    ft.inherit(base, 2)
    ft.save(1, {"x": x1, "y": torch.ones(8)})
    (part,) = ft.manifest(1)["items"]["x@0,0"]["parts"]
    assert part["reused"] and part["base"] is not None
    assert {part["object"], part["base"]["object"]} <= base.needs(2)
    got = {"x": torch.zeros_like(x1), "y": torch.zeros(8)}
    Checkpointer(str(tmp_path / "ft")).load(got, step=1)
    assert torch.equal(got["x"], x1) and torch.equal(got["y"], torch.ones(8))

"""`ckptflow generate`, `ckptflow evaluate` and `ckptflow hf-export`: run (or convert) a model from a checkpoint, an export folder
or a registered MLflow version.

    ckptflow generate runs/NAME/finetune/lr0.01-freeze1 40 --prompt R12345= --prompt 07+12=
    ckptflow generate models:/ckptflow-tiny@champion --prompt R12345= \\
        --tracking-uri sqlite:///runs/NAME/mlflow.db
    ckptflow evaluate runs/NAME/export/lr0.01-freeze1-step-00000040-fp32 --task rev
    ckptflow hf-export runs/NAME/pretrain 800 --to gpt2-folder   # transformers loads it

A checkpoint (ROOT STEP: a run root or its ckpt/ root) and an export folder are rebuilt here
(torch); a registered version is loaded with `mlflow.pyfunc.load_model`, as any MLflow user
would. `evaluate` scores greedy completions against the task's validation problems (the set the
training evaluator uses) and prints the exact match.
"""

from __future__ import annotations

import argparse
import os
import sys

MODELS = "models:/"
USAGE_EXIT = 2


def _parser(prog: str, doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=doc)
    p.add_argument(
        "source",
        help="ROOT (a run or checkpoint root, with STEP), an export folder, or "
        "models:/NAME@ALIAS | models:/NAME/VERSION",
    )
    p.add_argument("step", nargs="?", type=int, help="the checkpoint's step (with ROOT)")
    p.add_argument(
        "--tracking-uri",
        default="",
        help="MLflow store of a models:/ source (default: MLFLOW_TRACKING_URI), e.g. "
        "sqlite:///runs/NAME/mlflow.db",
    )
    return p


def _tracking(args) -> str:
    from ckptflow import env

    uri = args.tracking_uri or env.mlflow_tracking_uri()
    if not uri:
        raise ValueError(
            f"{args.source}: which MLflow store? pass --tracking-uri sqlite:///runs/NAME/mlflow.db "
            "(or set MLFLOW_TRACKING_URI)"
        )
    return uri


def _pyfunc(args):
    """The registered version a models:/ source names, loaded by MLflow."""
    if args.step is not None:
        raise ValueError("a models:/ source takes no STEP")
    # MLflow draws a download progress bar per load: noise around one line of output
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import mlflow

    from ckptflow import env

    with env.mlflow_default_store(_tracking(args)):  # for the load only: MLflow exports it
        return mlflow.pyfunc.load_model(args.source)


def load_gpt(args):
    """The GPT a checkpoint (ROOT STEP), an export folder or a models:/ source holds."""
    from ckptflow.steps.lib import generation

    if args.source.startswith(MODELS):
        return _pyfunc(args).unwrap_python_model().model
    if args.step is not None:
        return generation.load_checkpoint(args.source, args.step)
    if os.path.isdir(args.source) and any(
        n.endswith(".safetensors") for n in os.listdir(args.source)
    ):
        return generation.load_export(args.source)
    raise ValueError(
        f"{args.source}: not an export folder; give a STEP for a checkpoint root "
        "(`ckptflow ckpt ls ROOT` lists them) or a models:/NAME@ALIAS"
    )


def predictor(args, max_new_tokens: int):
    """prompts -> completions for the source the arguments name (a models:/ source through
    the registered pyfunc's own predict)."""
    if args.source.startswith(MODELS):
        model = _pyfunc(args)
        return lambda prompts: model.predict(prompts, params={"max_new_tokens": max_new_tokens})
    from ckptflow.steps.lib import generation

    gpt = load_gpt(args)
    return lambda prompts: generation.complete(gpt, prompts, max_new_tokens)


def _run(prog: str, body, args) -> int:
    """body(args) with the errors a user can cause said in one line (exit 2)."""
    from mlflow.exceptions import MlflowException

    from ckptflow.core.errors import CheckpointError

    try:
        return body(args)
    except (ValueError, CheckpointError, MlflowException, OSError) as exc:
        msg = getattr(exc, "message", None) or str(exc)
        print(f"ckptflow {prog}: {msg}".replace("\n", " ")[:1000], file=sys.stderr)
        return USAGE_EXIT


def generate_main(argv=None) -> int:
    """`ckptflow generate SOURCE [STEP] --prompt P ...`: one completion per prompt."""
    p = _parser("ckptflow generate", "greedy completions of prompts by a checkpoint or model")
    p.add_argument("--prompt", action="append", required=True, help="a prompt (repeatable)")
    p.add_argument("--max-new-tokens", type=int, default=8, help="at most this many tokens")
    args = p.parse_args(argv)

    def body(a) -> int:
        for prompt, text in zip(a.prompt, predictor(a, a.max_new_tokens)(a.prompt), strict=True):
            print(f"{prompt}{text}")
        return 0

    return _run("generate", body, args)


def evaluate_main(argv=None) -> int:
    """`ckptflow evaluate SOURCE [STEP] --task T`: exact match on the task's validation set."""
    from ckptflow.steps.lib.data import TASKS

    p = _parser("ckptflow evaluate", "exact match of a checkpoint or model on a task")
    p.add_argument("--task", required=True, choices=sorted(TASKS), help="the task to score")
    p.add_argument("--seed", type=int, default=0, help="the corpus seed (the run's --seed)")
    p.add_argument("-n", type=int, default=64, help="validation problems scored (1..10000)")
    p.add_argument("--show", type=int, default=3, help="print this many wrong answers")
    args = p.parse_args(argv)
    if not 1 <= args.n <= 10_000:
        p.error(f"-n must be 1..10000, got {args.n}")

    def body(a) -> int:
        from ckptflow.steps.lib.generation import exact_match

        score, rows = exact_match(predictor(a, 8), a.task, a.seed, a.n)
        wrong = [r for r in rows if r[1] != r[2]]
        for prompt, answer, got in wrong[: max(0, a.show)]:
            print(f"  wrong: {prompt}{got!r} (expected {answer!r})")
        print(f"{a.task}: exact match {score:.4f} ({len(rows) - len(wrong)}/{len(rows)})")
        return 0

    return _run("evaluate", body, args)


def hf_export_main(argv=None) -> int:
    """`ckptflow hf-export SOURCE [STEP] --to DIR`: a transformers GPT-2 folder."""
    p = _parser("ckptflow hf-export", "write a folder transformers loads as GPT-2")
    p.add_argument("--to", required=True, help="a new (or empty) local folder")
    args = p.parse_args(argv)

    def body(a) -> int:
        from ckptflow.steps.lib import hf_gpt2

        gpt = load_gpt(a)
        hf_gpt2.write(gpt.state_dict(), gpt.cfg.to_dict(), a.to)
        print(f"wrote {a.to}: transformers.AutoModelForCausalLM.from_pretrained({a.to!r})")
        return 0

    return _run("hf-export", body, args)

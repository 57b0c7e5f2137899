"""The workflow <-> step contract: each step's arguments as one frozen dataclass.

    from ckptflow.contract import PretrainArgs, parse, to_argv

    argv = to_argv(PretrainArgs(run_root="s3://b/r", max_steps=200))  # what a builder renders
    args = parse(PretrainArgs, argv)                                  # what the step runs

Imports neither torch nor hera: the steps and the workflow builders both depend on it.
"""

from __future__ import annotations

from ckptflow.contract.argv import Spec, arg, parse, parser, specs, to_argv
from ckptflow.contract.stepargs import (
    EXPERIMENT,
    MODELS,
    PARALLEL,
    STEP_ARGS,
    TASKS,
    DrillArgs,
    EvaluateArgs,
    FinetuneArgs,
    FinishRunArgs,
    PretrainArgs,
    RdzvArgs,
    SelectArgs,
    StartRunArgs,
)

__all__ = [
    "EXPERIMENT",
    "MODELS",
    "PARALLEL",
    "TASKS",
    "STEP_ARGS",
    "DrillArgs",
    "EvaluateArgs",
    "FinetuneArgs",
    "FinishRunArgs",
    "PretrainArgs",
    "RdzvArgs",
    "SelectArgs",
    "Spec",
    "StartRunArgs",
    "arg",
    "parse",
    "parser",
    "specs",
    "to_argv",
]

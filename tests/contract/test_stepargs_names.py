"""The contract's torch-free lists of model sizes and tasks are the steps' own."""

from __future__ import annotations

from ckptflow.steps.lib import data, model

from ckptflow.contract import MODELS, TASKS


def test_models_and_tasks_match_the_steps():
    assert tuple(model.SIZES) == MODELS
    assert tuple(data.TASKS) == TASKS

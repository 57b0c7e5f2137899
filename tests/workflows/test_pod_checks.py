"""Settings that must fit together in one pod (workflows/pod_checks.py): one line at render."""

from __future__ import annotations

import pytest
from ckptflow.workflows import render
from ckptflow.workflows.config import ConfigError, PipelineConfig, apply_overrides, validate


@pytest.mark.parametrize(
    "sets, message",
    [
        (
            ["pretrain.shm_size=2Gi"],
            "--set pretrain.shm_size=2Gi: above the pod's memory limit "
            "pretrain.rank_resources.memory=1536Mi",
        ),
        (["finetune.shm_size=4Gi"], "--set finetune.shm_size=4Gi: above the pod's memory limit"),
        (
            ["pretrain.rank_resources.gpu=8"],
            "--set pretrain.procs_per_rank=1: a pod requesting 8 GPU(s) "
            "(pretrain.rank_resources.gpu=8) runs one process per GPU; set pretrain.procs_per_rank=8",
        ),
        (["finetune.resources.gpu=2"], "--set finetune.workers=1: a pod requesting 2 GPU(s)"),
    ],
)
def test_a_pod_whose_settings_do_not_fit_is_refused(sets, message):
    with pytest.raises(ConfigError) as info:
        validate(apply_overrides(PipelineConfig(), sets))
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_settings_that_fit_pass():
    ok = ["pretrain.rank_resources.gpu=8", "pretrain.procs_per_rank=8", "pretrain.shm_size="]
    validate(apply_overrides(PipelineConfig(), ok))
    validate(PipelineConfig())


def test_render_exits_non_zero_with_one_line(capsys):
    rc = render.main(["pipeline", "--set", "pretrain.shm_size=8Gi", "-o", "/dev/null"])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and len(err.splitlines()) == 1 and "pretrain.shm_size=8Gi" in err

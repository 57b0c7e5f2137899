"""The planner's detection follows the gang's settings (issue 34): max(process-group timeout,
node grace period + node-loss toleration), not a fixed minute."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
from ckptflow.workflows.config import PlatformConfig

from ckptflow import plan_cli
from ckptflow.contract import PretrainArgs
from ckptflow.core import recovery as rec

ARGV = [
    "--params=7B", "--gpus=16", "--write-gib-s=2", "--mtbf=48h", "--run-length=7d", "--json",
]  # fmt: skip


def plan_json(capsys, *extra: str) -> dict:
    assert plan_cli.main([*ARGV, *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_detection_waits_for_the_last_rank_out():
    assert rec.gang_detect_s(120, 50, 60) == 120  # survivors' timeout is the later one
    assert rec.gang_detect_s(30, 50, 300) == 350  # Kubernetes' default toleration: eviction
    assert rec.gang_detect_s(600, 50, 60) == 600
    assert rec.gang_detect_s(120, 50, 0) == 350  # 0: none rendered, so Kubernetes' 300 s


def test_the_formulas_defaults_are_the_workflows_settings():
    pg = {f.name: f.default for f in fields(PretrainArgs)}["pg_timeout_s"]
    assert pg == rec.DEFAULT_PG_TIMEOUT_S
    assert PlatformConfig().node_monitor_grace_s == rec.DEFAULT_NODE_GRACE_S
    assert PlatformConfig().gpu_node_loss_toleration_s == rec.DEFAULT_NODE_LOSS_TOLERATION_S


def test_plan_detects_by_the_settings_and_each_setting_moves_it(capsys):
    default = plan_json(capsys)["inputs"]
    assert default["detect_s"] == 120.0  # max(120, 50 + 60), no longer a fixed 60 s
    late = plan_json(capsys, "--node-loss-toleration=5m")["inputs"]
    assert late["detect_s"] == 350.0  # no rendered toleration: Kubernetes' 300 s
    assert plan_json(capsys, "--pg-timeout=10m")["inputs"]["detect_s"] == 600.0
    assert plan_json(capsys, "--node-loss-toleration=0")["inputs"]["detect_s"] == 350.0
    assert plan_json(capsys, "--node-grace=40s", "--pg-timeout=30s")["inputs"]["detect_s"] == 100
    rto = plan_json(capsys, "--rto=1h")["recovery"]
    assert rto["detect_s"] == 120.0
    assert rto["rto_s"] == pytest.approx(120 + 300 + 240 + rto["load_s"])


def test_a_given_detect_or_restart_stands_and_mixing_is_one_line(capsys):
    assert plan_json(capsys, "--detect=30s")["inputs"]["detect_s"] == 30.0
    assert plan_json(capsys, "--restart=10m")["inputs"]["detect_s"] is None  # split 1:5:4
    assert plan_cli.main([*ARGV, "--detect=30s", "--pg-timeout=1m"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--pg-timeout" in line and "not both" in line

"""Issue 34 point 4, the way a node loss fails: a GPU node holding a rank goes silent mid-run
(`--fail-node`: its pods frozen, their traffic dropped, nothing closes a socket). The survivor's
collective times out (pretrain.pg_timeout_s) and its pod fails; the lost rank is evicted after
the node grace period plus the rendered node-loss toleration and retried on the spare GPU node;
every rank comes back and resumes from the newest valid checkpoint; the run ends Succeeded.

Prints the run's time and the recovery measured by the steps (ckptflow.core.liveness); the
comparison with an undisturbed run is a measurement, not asserted here.
"""

from __future__ import annotations

import re

import pytest
from ckptflow.workflows.runner.cluster import load_profile
from ckptflow.workflows.runner.nodelifecycle import FailNode, freezer_problem
from ckptflow.workflows.runner.pods import available

from tests.workflows.isolated import run_isolated
from tests.workflows.test_node_loss import BASE, _attempt_logs, _attempts
from tests.workflows.test_node_loss_cluster import ON_GPU_NODES, PROFILE

WHY = available() or freezer_problem()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(WHY is not None, reason=f"pods or freezer unavailable: {WHY}"),
]
FAIL_AFTER_S = 30.0
PG_TIMEOUT_S = 60


@pytest.mark.timeout(900)
def test_a_rank_node_lost_silently_restarts_the_gang_and_succeeds(tmp_path):
    profile = tmp_path / "cluster.yaml"
    profile.write_text(PROFILE)
    overrides = [
        *BASE, *ON_GPU_NODES, "pretrain.max_steps=200", "pretrain.ckpt_every=20",
        f"pretrain.pg_timeout_s={PG_TIMEOUT_S}", "pretrain.timeout=840",
    ]  # fmt: skip
    out = run_isolated(
        tmp_path, "silent", overrides,
        cluster=load_profile(str(profile)), fail_nodes=[FailNode("gpu-0", FAIL_AFTER_S)],
    )  # fmt: skip
    result = out.result
    assert result.phase == "Succeeded", result.table
    events = result.status["status"]["local"]["nodeLifecycle"]
    assert any(e.get("event") == "TaintManagerEviction" for e in events), events
    retried = [i for i in (0, 1) if len(_attempts(result, i)) >= 2]
    assert retried, result.table  # the lost rank came back (elsewhere: gpu-0 is gone)
    lost = _attempts(result, retried[0])
    assert lost[0]["hostNodeName"] == "gpu-0" and lost[-1]["hostNodeName"] != "gpu-0"
    logs = "".join(log for i in (0, 1) for log in _attempt_logs(result, i))
    # the survivor left within its pg timeout: its collective failed, or its rendezvous host
    # (rank 0 on gpu-0) stopped answering for as long (whichever came first)
    assert "a collective failed" in logs or "has not answered for" in logs, logs[-3000:]
    resumed = re.findall(r"\[rank(\d)\] \S+ INFO resumed from step (\d+)", logs)
    assert {r for r, _ in resumed} == {"0", "1"}, resumed
    recovered = re.findall(r"recovered: ([\d.]+) s from the last progress", logs)
    assert recovered, logs[-3000:]
    print(f"\nsilent loss of gpu-0 at {FAIL_AFTER_S:.0f} s: run took {out.took:.0f} s, "
          f"recovery measured {recovered} s, node events {events}")  # fmt: skip

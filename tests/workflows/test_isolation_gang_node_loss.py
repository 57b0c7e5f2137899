"""Issue 34 end to end, the way a node loss fails in production: the rendered pretraining
workflow with gang-scheduled ranks (Volcano) on 1 CPU node + 3 one-GPU nodes, short settings
(process-group timeout 15 s, node grace period 2 s, node-loss tolerationSeconds 3 s), and the
GPU node of one rank lost silently (`--fail-node gpu-1@40`: its pods frozen, their traffic
dropped, nothing closes a socket) after checkpoints are committed.

What must hold: the lost rank's pod is frozen (Running, not killed) until the taint manager
evicts it after its tolerationSeconds; the survivor's training leaves within the process-group
timeout on its own (a bounded wait, not gloo's 30 min); every rank restarts, the lost one
re-admitted into its gang on the spare GPU node (gpu-1 is tainted and never used again), and
resumes from the newest checkpoint committed before the loss; the workflow Succeeds; `ckptflow
ckpt stats ROOT --json` reports the recovery, measured within the RTO that `ckptflow plan`
computes from the same settings, and every rank was out within the planner's detection.

How the survivor comes back: its worker exits (PEER_LOST_EXIT) and torchrun restarts it in its
own pod (`pretrain.max_restarts`), in the rendezvous its pod hosts or joins, where the lost
rank's retry meets it; the survivor's pod is not recreated. The test says which happened.
Root, pods, the cgroup freezer; about 4 minutes here (slow).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import datetime

import pytest
from ckptflow.workflows.local_services import S3_BUCKET, S3_KEYS
from ckptflow.workflows.runner.cluster import load_profile
from ckptflow.workflows.runner.nodelifecycle import FailNode, freezer_problem
from ckptflow.workflows.runner.pods import available

from tests.workflows.isolated import run_isolated
from tests.workflows.test_node_loss import BASE, _attempt_logs, _attempts
from tests.workflows.test_node_loss_cluster import ON_GPU_NODES
from tests.workflows.test_node_loss_cluster import PROFILE as NODES

WHY = available() or freezer_problem()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(WHY is not None, reason=f"pods or freezer unavailable: {WHY}"),
]
GRACE_S, TOLERATION_S, PG_TIMEOUT_S = 2, 3, 15
# the control plane's side of the same settings (the profile is the cluster the render targets)
PROFILE = f"nodeMonitorGracePeriod: {GRACE_S}s\nnodeMonitorPeriod: 0.5\n" + NODES
SETTINGS = [
    "platform.gang_scheduler=volcano",
    f"platform.node_monitor_grace_s={GRACE_S}",
    f"platform.gpu_node_loss_toleration_s={TOLERATION_S}",
    f"pretrain.pg_timeout_s={PG_TIMEOUT_S}",
]
FAIL_AFTER_S = 40.0  # after gpu-1's first pod started: past a committed checkpoint here


class StatsReader:
    """In front of the run's S3 (run_isolated's `gate`): passes the endpoint through, and
    before the server stops reads `ckptflow ckpt stats ROOT --json` of the run's checkpoints
    with the real CLI."""

    def __init__(self, root: str) -> None:
        self.root, self.stats, self.error = root, None, ""

    def open_to(self, host: str, endpoint: str) -> str:
        self.endpoint = endpoint
        return endpoint

    def close(self) -> None:
        env = {**os.environ, **S3_KEYS, "AWS_ENDPOINT_URL": self.endpoint}
        env["AWS_DEFAULT_REGION"] = "us-east-1"
        cmd = [sys.executable, "-m", "ckptflow.cli", "ckpt", "stats", self.root, "--json"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        self.error = done.stderr
        if done.returncode == 0:
            self.stats = json.loads(done.stdout)


def planned_rto() -> dict:
    """`ckptflow plan`'s recovery from the run's settings (a tiny model on 2 one-GPU hosts)."""
    cmd = [
        sys.executable, "-m", "ckptflow.cli", "plan", "--params", "1e6", "--gpus", "2",
        "--gpus-per-host", "1", "--write-gib-s", "1", "--mtbf", "48h", "--run-length", "1d",
        "--pg-timeout", f"{PG_TIMEOUT_S}s", "--node-grace", f"{GRACE_S}s",
        "--node-loss-toleration", f"{TOLERATION_S}s", "--json",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout)["recovery"]


def _at(line: str) -> float:
    """The unix time of a step's log line (logging's local time, to the millisecond)."""
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _lines(log: str, pattern: str) -> list[tuple[float, re.Match]]:
    """(time, match) of each timestamped line of `log` matching `pattern`."""
    found = []
    for line in log.splitlines():
        m = re.search(pattern, line)
        if m and re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", line):
            found.append((_at(line), m))
    return found


@pytest.mark.timeout(900)
def test_a_gpu_node_lost_silently_restarts_the_gang_elsewhere_within_the_planned_rto(tmp_path):
    profile = tmp_path / "cluster.yaml"
    profile.write_text(PROFILE)
    name = "gang-loss"
    reader = StatsReader(f"s3://{S3_BUCKET}/runs/{name}/pretrain/ckpt")
    overrides = [
        *BASE, *ON_GPU_NODES, *SETTINGS, "pretrain.max_steps=400", "pretrain.ckpt_every=10",
        "pretrain.retries=3", "pretrain.timeout=840",
    ]  # fmt: skip
    out = run_isolated(
        tmp_path, name, overrides, gate=reader,
        cluster=load_profile(str(profile)), fail_nodes=[FailNode("gpu-1", FAIL_AFTER_S)],
    )  # fmt: skip
    result = out.result
    assert result.phase == "Succeeded", result.table
    events = {e["event"]: e for e in result.status["status"]["local"]["nodeLifecycle"]}
    lost_at = events["NodeLost"]["atUnix"]
    not_ready_s = events["NodeNotReady"]["atUnix"] - lost_at
    evicted_s = events["TaintManagerEviction"]["atUnix"] - lost_at

    # The gang: its PodGroup applied, both first attempts bound together on two GPU nodes.
    assert [n["phase"] for n in result.nodes.values() if n["displayName"] == "podgroup"] == [
        "Succeeded"
    ]
    first = [_attempts(result, i)[0] for i in (0, 1)]
    assert sorted(p["hostNodeName"] for p in first) == ["gpu-0", "gpu-1"], result.table
    lost_rank = next(i for i in (0, 1) if first[i]["hostNodeName"] == "gpu-1")
    survivor = 1 - lost_rank

    # The lost rank's pod was frozen, not killed: Running until the taint manager deleted it
    # (Argo: Error "pod deleted", no exit code), its log silent from the loss on.
    lost = _attempts(result, lost_rank)
    assert lost[0]["phase"] == "Error" and lost[0]["message"] == "pod deleted", lost[0]
    assert lost[0]["local"]["finishedAtUnix"] >= events["TaintManagerEviction"]["atUnix"] - 0.5
    frozen_log = _attempt_logs(result, lost_rank)[0]
    assert max(t for t, _ in _lines(frozen_log, r".")) <= lost_at + 1.0
    # NotReady after the grace period (checked every nodeMonitorPeriod), eviction after the
    # rendered tolerationSeconds
    assert GRACE_S <= not_ready_s <= GRACE_S + 2.0, events
    assert TOLERATION_S - 0.2 <= evicted_s - not_ready_s <= TOLERATION_S + 1.0, events

    # The survivor's training left within the process-group timeout, on its own: the worker
    # was not killed by torchrun after an unanswered SIGTERM (a save thread waiting 30 min).
    survivor_log = _attempt_logs(result, survivor)[0]
    left = _lines(survivor_log, r"a collective failed .*pg_timeout_s=(\d+)")
    assert left and left[0][0] - lost_at <= PG_TIMEOUT_S + 10, survivor_log[-3000:]
    left_s = left[0][0] - lost_at
    assert "forcefully exiting via 9" not in survivor_log, survivor_log[-3000:]

    # Every rank came back on healthy nodes, never on gpu-1 again, and resumed from the
    # newest checkpoint committed before the loss.
    retry = lost[-1]
    assert len(lost) == 2 and retry["phase"] == "Succeeded", result.table
    assert retry["hostNodeName"] == "gpu-2", result.table
    rank_pods = [p for i in (0, 1) for p in _attempts(result, i)]
    assert not [
        p
        for p in rank_pods
        if p["hostNodeName"] == "gpu-1" and p["local"]["startedAtUnix"] > lost_at
    ]
    logs = "".join(log for i in (0, 1) for log in _attempt_logs(result, i))
    committed = [
        int(m.group(1)) for t, m in _lines(logs, r"checkpoint (\d+) committed") if t < lost_at
    ]
    assert committed, "no checkpoint committed before the loss: FAIL_AFTER_S too short"
    resumed = _lines(logs, r"\[rank(\d)\] \S+ INFO resumed from step (\d+)")
    assert sorted((m.group(1), int(m.group(2))) for _, m in resumed) == [
        ("0", max(committed)),
        ("1", max(committed)),
    ], resumed
    resumed_s = min(t for t, _ in resumed) - lost_at
    assert "pretrain: 40 committed checkpoints" in out.text, out.text

    # ckpt stats reports the recovery, measured within the planner's RTO for these settings;
    # and every rank was out (the gang could restart) within the planner's detection.
    assert reader.stats is not None, reader.error
    measured = reader.stats["recoveries"]["measured"]
    assert len(measured) == 1 and measured[0]["resumed_step"] == max(committed), measured
    plan = planned_rto()
    assert plan["detect_s"] == max(PG_TIMEOUT_S, GRACE_S + TOLERATION_S)
    assert max(left_s, evicted_s) <= plan["detect_s"] + 5.0
    assert measured[0]["recovery_s"] <= plan["rto_s"], (measured, plan)
    came_back = {
        i: f"{len(pods)} pod(s), last on {pods[-1]['hostNodeName']}"
        for i, pods in ((i, _attempts(result, i)) for i in (0, 1))
    }
    assert all(_attempts(result, i)[-1]["hostNodeName"] != "gpu-1" for i in (0, 1)), came_back
    print(
        f"\nranks came back: {came_back}; frozen at +0; survivor out +{left_s:.1f}s (pg "
        f"timeout {PG_TIMEOUT_S}s); NotReady +{not_ready_s:.1f}s; evicted +{evicted_s:.1f}s; "
        f"retried on {retry['hostNodeName']} "
        f"+{retry['local']['startedAtUnix'] - lost_at:.1f}s; resumed from step {max(committed)} "
        f"+{resumed_s:.1f}s; ckpt stats recovery {measured[0]['recovery_s']:.1f}s (last "
        f"progress to resumed progress) vs planned RTO {plan['rto_s']:.0f}s (detect "
        f"{plan['detect_s']:.0f}s + reschedule {plan['reschedule_s']:.0f}s + load + warm-up "
        f"{plan['warmup_s']:.0f}s); run {out.took:.0f}s"
    )

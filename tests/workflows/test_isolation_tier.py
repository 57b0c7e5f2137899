"""Issue 35 point 6, end to end: the local checkpoint tier through a silent node loss.

The rendered pretraining workflow in `--isolate` on 1 CPU node + 3 one-GPU nodes (the profile
of test_node_loss_cluster), 2 ranks each requesting `nvidia.com/gpu: 1`, `pretrain.local_every=5`
and `pretrain.replicas=1` with the default volume (`platform.local_volume=emptyDir`), durable
saves every 50 steps (1,000 steps: the loss falls mid-run); the GPU node of rank 1 (not the rendezvous host's: node rank 0 hosts
it) fails silently 60 s after its first pod started (`--fail-node gpu-1@60`: about 30 s into
training here, see FAIL_AFTER_S).

Which pods survive, and so why the default volume is enough: the survivor's worker leaves
within the process-group timeout and torchrun restarts it in the SAME pod
(`pretrain.max_restarts`, steps/rdzv.py: rank 0's pod hosts the rendezvous and keeps it), so
its emptyDir keeps its own pieces and the replica of rank 1's piece; the lost rank's pod is
evicted after the node grace period plus its toleration and retried by Argo on the spare node
gpu-2 with a new, empty emptyDir, and fetches its piece from the survivor. Were the survivor's
pod recreated (the rendezvous host's node lost: its survivors exit 7 and their pods are
retried), every emptyDir would be new and the recovery would read object storage:
`platform.local_volume=hostPath` would then keep a node's pieces for a retry on that node
(not for one elsewhere). The test says which happened.

What must hold: the recovery reads at most 1 MiB from object storage (`ckptflow ckpt stats
--json` recoveries.store_bytes), every rank resumes from a step newer than the newest durable
step committed before the loss, and the workflow Succeeds.

Root, pods, the cgroup freezer; a few minutes (slow): run it alone with `-m "" -s`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from ckptflow.workflows.local_services import S3_BUCKET, S3_KEYS
from ckptflow.workflows.runner.cluster import load_profile
from ckptflow.workflows.runner.nodelifecycle import FailNode, freezer_problem
from ckptflow.workflows.runner.pods import available

from tests.workflows.isolated import run_isolated
from tests.workflows.test_isolation_gang_node_loss import PROFILE, SETTINGS, _lines
from tests.workflows.test_node_loss import BASE, _attempt_logs, _attempts
from tests.workflows.test_node_loss_cluster import ON_GPU_NODES

WHY = available() or freezer_problem()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(WHY is not None, reason=f"pods or freezer unavailable: {WHY}"),
]
# after the first pod on gpu-1 started. The issue says 30 s in: into training, as it assumed a
# quick start. Here a rank pod needs 25-35 s to train its first step on a loaded host
# (imports, the rendezvous): a loss at 30 s fell on step 5, before any local step had
# committed (run 3), so the loss comes 60 s after the pod started, 25-35 s into training.
FAIL_AFTER_S = 60.0
LOCAL_EVERY, CKPT_EVERY, REPLICAS = 5, 50, 1
TIER = [
    f"pretrain.local_every={LOCAL_EVERY}",
    f"pretrain.replicas={REPLICAS}",
    f"pretrain.ckpt_every={CKPT_EVERY}",
    "platform.local_volume_size=1Gi",
    # no preflight: on a loaded host it alone took the 30 s before the loss (and failed a
    # rank "3.4x slower" at random, costing a retry); the loss must fall into training
    "pretrain.preflight_factor=0",
]
MIB = 2**20


class RootReader:
    """In front of the run's S3 (run_isolated's `gate`): passes the endpoint through, and
    before the server stops reads `ckptflow ckpt stats ROOT --json` and `ckptflow ckpt ls
    ROOT --json` of the run's durable checkpoints with the real CLI."""

    def __init__(self, root: str) -> None:
        self.root, self.stats, self.rows, self.errors = root, None, None, []

    def open_to(self, host: str, endpoint: str) -> str:
        self.endpoint = endpoint
        return endpoint

    def _cli(self, *words: str):
        env = {**os.environ, **S3_KEYS, "AWS_ENDPOINT_URL": self.endpoint}
        env["AWS_DEFAULT_REGION"] = "us-east-1"
        cmd = [sys.executable, "-m", "ckptflow.cli", "ckpt", *words, self.root, "--json"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        self.errors.append(done.stderr)
        return json.loads(done.stdout) if done.returncode == 0 else None

    def close(self) -> None:
        self.stats = self._cli("stats")
        self.rows = self._cli("ls")


@pytest.mark.timeout(900)
def test_a_silent_node_loss_recovers_from_the_local_tier_and_peers_not_object_storage(tmp_path):
    profile = tmp_path / "cluster.yaml"
    profile.write_text(PROFILE)
    name = "tier-loss"
    reader = RootReader(f"s3://{S3_BUCKET}/runs/{name}/pretrain/ckpt")
    overrides = [
        *BASE, *ON_GPU_NODES, *SETTINGS, *TIER, "pretrain.max_steps=1000", "pretrain.retries=3",
        "pretrain.timeout=840",
    ]  # fmt: skip
    out = run_isolated(
        tmp_path, name, overrides, gate=reader,
        cluster=load_profile(str(profile)), fail_nodes=[FailNode("gpu-1", FAIL_AFTER_S)],
    )  # fmt: skip
    result = out.result
    logs = "".join(log for i in (0, 1) for log in _attempt_logs(result, i))
    assert result.phase == "Succeeded", (result.table, logs[-4000:])
    events = {e["event"]: e for e in result.status["status"]["local"]["nodeLifecycle"]}
    lost_at = events["NodeLost"]["atUnix"]

    # Which pods survived: rank 1's node was lost (rank 0's pod hosts the rendezvous); its pod
    # was evicted and retried on gpu-2; the survivor stayed in its pod (torchrun restarted its
    # worker), so its emptyDir kept the replica of rank 1's piece.
    first = [_attempts(result, i)[0] for i in (0, 1)]
    placed = {i: p["hostNodeName"] for i, p in enumerate(first)}
    assert placed == {0: "gpu-0", 1: "gpu-1"}, placed
    lost, survivor = _attempts(result, 1), _attempts(result, 0)
    assert lost[0]["message"] == "pod deleted" and lost[-1]["hostNodeName"] == "gpu-2", lost
    assert len(survivor) == 1, (
        "the survivor's pod was recreated: its emptyDir (and rank 1's replica) went with it",
        [(p["phase"], p.get("message")) for p in survivor],
    )

    # Resumed from the local tier: a step newer than the newest durable one before the loss.
    assert reader.rows is not None and reader.stats is not None, reader.errors
    durable = [
        r["step"]
        for r in reader.rows
        if r["state"] == "committed" and (r["committed_at"] or 0) < lost_at
    ]
    saved = [t for t, _ in _lines(logs, r"local tier: deleted steps|drained step") if t < lost_at]
    assert saved, "the node was lost before any local save: startup took the whole FAIL_AFTER_S"
    resumed = _lines(logs, r"\[rank(\d)\] \S+ INFO resumed from step (\d+)")
    steps = {m.group(1): int(m.group(2)) for t, m in resumed if t > lost_at}
    assert set(steps) == {"0", "1"} and len(set(steps.values())) == 1, resumed
    step = steps["0"]
    assert step > max(durable, default=-1), (step, durable)
    assert step % LOCAL_EVERY == 0, step

    # ... and read at most 1 MiB of object storage for it (ckpt stats, C's recovery record).
    recoveries = reader.stats["recoveries"]
    by_source, store_bytes = recoveries["by_source"], recoveries["store_bytes"]
    measured = recoveries["measured"]
    sources = re.findall(r"\[rank(\d)\] .*resumed from step (\d+) .* from (\w+): (\d+) bytes", logs)
    print(
        f"\nnode gpu-1 lost at +{FAIL_AFTER_S:.0f} s; NotReady "
        f"+{events['NodeNotReady']['atUnix'] - lost_at:.1f}s, evicted "
        f"+{events['TaintManagerEviction']['atUnix'] - lost_at:.1f}s; rank 1 retried on "
        f"{lost[-1]['hostNodeName']}; survivor pods {len(survivor)}; durable steps before the "
        f"loss {durable}; resumed from step {step}; recoveries by source {by_source}, "
        f"store bytes {store_bytes}; measured {measured}; each resume (rank, step, source, "
        f"bytes from object storage) {sources}; run {out.took:.0f} s"
    )
    assert store_bytes <= MIB, recoveries
    assert by_source.get("local", 0) + by_source.get("peer", 0) >= 1, recoveries

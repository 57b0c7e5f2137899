"""Issue 34 under --isolate: the rendezvous host's pod (rank 0, which hosts the store) is killed
mid-training as a node loss kills it; the run ends Succeeded.

Before, the store lived in a daemon pod whose IP was baked into the ranks' arguments; now a
retried rank 0 publishes a new generation in the run root, the survivor's pod fails (its store
is gone), comes back, finds the new generation and every rank resumes from the newest valid
checkpoint. The measured recovery is in rank 0's log (ckptflow.core.liveness).
"""

from __future__ import annotations

import re

import pytest
from ckptflow.workflows.runner.pods import available

from tests.workflows.test_node_loss import Killer, _attempt_logs, _attempts, _log, _run

WHY = available()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(WHY is not None, reason=f"pods unavailable: {WHY}"),
]


@pytest.mark.timeout(600)
def test_killing_the_rendezvous_hosts_pod_mid_run_still_succeeds(tmp_path):
    def killer_for(node):
        # the pod hosting the store (node rank 0), once any rank saw step 20 committed (the
        # torch rank that logs it may live in either pod: c10d assigns ranks by arrival)
        return Killer(
            node,
            lambda pod: "hosting the rendezvous store" in _log(pod),
            lambda pod: any("checkpoint 20 committed" in _log(p) for p in list(node.pods())),
        )

    result, text, killer, took = _run(
        tmp_path, "rdzv-host", ["pretrain.pg_timeout_s=20"], killer_for
    )
    assert len(killer.killed) == 1, result.table
    assert result.phase == "Succeeded", result.table
    hosts = _attempts(result, 0)
    assert len({n["podIP"] for n in hosts}) == len(hosts) >= 2  # a new pod, a new IP
    logs = "".join(log for i in (0, 1) for log in _attempt_logs(result, i))
    generations = sorted({int(g) for g in re.findall(r"generation (\d+): hosting", logs)})
    assert generations[:2] == [1, 2], generations  # each start of rank 0: a new generation
    assert "pretrain: 6 committed checkpoints" in text, text
    resumed = re.findall(r"\[rank(\d)\] \S+ INFO resumed from step (\d+)", logs)
    assert {r for r, _ in resumed} == {"0", "1"}, resumed
    recovered = re.findall(r"recovered: ([\d.]+) s from the last progress", logs)
    assert recovered, logs[-3000:]  # each restart of the training measured its recovery
    print(f"run took {took:.0f} s; recovery measured {recovered} s; killed {killer.killed}")

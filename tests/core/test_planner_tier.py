"""`ckptflow plan` with the local tier (issue 35): a node loss resumes from the local tier when
each piece has a replica on another host, so the RPO follows the local interval (plus the local
write and the replication behind it) and the load reads local disk and one peer fetch instead
of object storage; without replicas a node loss still reads object storage. Hand-computed on
the reference case of docs/planner.md (28.8e9 bytes per host)."""

from __future__ import annotations

import json

import pytest

from ckptflow import plan_cli
from ckptflow.core import recovery as rec
from ckptflow.core.planner import PlanInputs, plan

GIB = 2**30
S_H = 28.8e9  # 300B x 12 bytes over 125 hosts
REF = [
    "--params=300B", "--weights=fp32", "--gpus=1000", "--write-gib-s=4",
    "--snapshot-gib-s=40", "--mtbf=5000h", "--mtbf-per=node", "--run-length=60d",
    "--interval=1h", "--json",
]  # fmt: skip
TIER = ["--local-interval=5m", "--replicas=1", "--local-write-gib-s=10", "--peer-gib-s=12"]


def plan_json(capsys, *extra: str, code: int = 0) -> dict:
    assert plan_cli.main([*REF, *extra]) == code
    return json.loads(capsys.readouterr().out)


def test_with_replicas_a_node_loss_resumes_from_the_local_tier_by_hand(capsys):
    r = plan_json(capsys, *TIER)["recovery"]
    d = S_H / (40 * GIB)  # the snapshot: local saves are async like durable ones
    w_local, replicate = S_H / (10 * GIB), S_H / (12 * GIB)
    assert r["source"] == "peer" and r["store_bytes"] == 0.0 and r["replicas"] == 1
    assert r["interval_s"] == r["local_interval_s"] == 300.0
    assert r["stall_s"] == pytest.approx(d)
    assert r["background_s"] == pytest.approx(w_local + replicate)
    assert r["rpo_expected_s"] == pytest.approx((300 + d) / 2 + w_local + replicate)
    assert r["rpo_worst_s"] == pytest.approx(300 + d + w_local + replicate)
    # a replaced host fetches its piece from a peer, then reads it from local disk
    assert r["load_s"] == pytest.approx(S_H / (12 * GIB) + S_H / (10 * GIB))
    assert r["rto_s"] == pytest.approx(120 + 300 + 240 + r["load_s"])


def test_without_the_tier_or_without_replicas_a_node_loss_reads_object_storage(capsys):
    off = plan_json(capsys)["recovery"]
    assert (off["source"], off["store_bytes"], off["local_interval_s"]) == ("store", S_H, None)
    alone = plan_json(capsys, "--local-interval=5m")
    r = alone["recovery"]
    assert (r["source"], r["store_bytes"], r["interval_s"]) == ("store", S_H, 3600.0)
    assert r["rpo_worst_s"] == pytest.approx(off["rpo_worst_s"])  # nothing gained for a node
    assert any("replicas 0" in w for w in alone["warnings"])
    capsys.readouterr()


def test_an_rpo_target_solves_the_local_interval(capsys):
    r = plan_json(capsys, *TIER, "--rpo=10m")["recovery"]
    tau = 600 - S_H / (40 * GIB) - S_H / (10 * GIB) - S_H / (12 * GIB)
    assert r["interval_needed_s"] == pytest.approx(tau) and r["problems"] == []


def test_a_local_interval_not_shorter_than_the_durable_one_is_said():
    result = plan(
        PlanInputs(
            params=1e9,
            gpus=16,
            write_gib_s=1,
            mtbf_s=86400,
            run_s=86400,
            interval_s=600,
            local_interval_s=900,
            replicas=1,
        )  # fmt: skip
    )
    assert any("not shorter than the durable" in w for w in result.warnings)


@pytest.mark.parametrize(
    ("argv", "phrase"),
    [
        (["--gpus-per-host=500", "--local-interval=5m", "--replicas=2"], "use at most 1"),
        (["--replicas=1"], "need its interval (--local-interval)"),
        (["--local-interval=5m", "--peer-gib-s=0"], "peer_gib_s must be positive"),
        (["--local-interval=5m", "--replicas=-1"], "replicas must be 0 to 1000"),
    ],
)
def test_bad_local_tier_input_is_one_line_exit_2(capsys, argv, phrase):
    assert plan_cli.main([*REF, *argv]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert phrase in line, line


def test_the_table_says_where_a_node_loss_resumes_from(capsys):
    assert plan_cli.main([a for a in REF if a != "--json"] + TIER) == 0
    out = capsys.readouterr().out
    assert "node loss resumes from      local tier, 1 replica(s)" in out
    assert "read from object storage  0 B per host" in out


def test_local_terms_sync_without_a_snapshot():
    tier = rec.LocalTier(60, 1, write_gib_s=2, read_gib_s=4, peer_gib_s=1)
    stall, background, load, bandwidth = rec.local_terms(tier, 4 * GIB, None)
    assert (stall, background) == (2.0, 4.0)  # sync: the local write stalls; replication after
    assert load == 4.0 + 1.0 and bandwidth == pytest.approx(4 / 5)

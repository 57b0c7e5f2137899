"""The checkpoint planner against hand-computed cases (docs/planner.md has the formulas)."""

from __future__ import annotations

import json
import math

import pytest

from ckptflow import cli, plan_cli
from ckptflow.core.planner import (
    PlanInputs,
    daly_interval,
    parse_count,
    plan,
    precision_bytes,
    simulate_footprint,
    young_interval,
)

H, D = 3600, 86400
GIB = 1073741824


def brief_run(**overrides) -> PlanInputs:
    """The brief's run: 300B parameters, 1,000 GPUs at 8 per host, bf16 weights + fp32 AdamW
    moments + fp32 master (14 B/param); 4 GiB/s write and 40 GiB/s snapshot per host; MTBF
    5000 h per host (job: 5000 h / 125 = 40 h = 144000 s); 60 days of training."""
    args = dict(
        params=300e9,
        gpus=1000,
        gpus_per_host=8,
        weight_bytes=2,
        optimizer_bytes=8,
        master_bytes=4,
        write_gib_s=4,
        snapshot_gib_s=40,
        mtbf_s=5000 * H,
        mtbf_per="node",
        run_s=60 * D,
        restart_s=600,
    )
    return PlanInputs(**(args | overrides))


def test_precision_and_count_parsing():
    assert precision_bytes("bf16") == 2 and precision_bytes("FP32") == 4
    assert precision_bytes("fp8") == 1 and precision_bytes("none") == 0
    assert precision_bytes("1.5") == 1.5
    with pytest.raises(ValueError, match="unknown precision 'int3'"):
        precision_bytes("int3")
    assert parse_count("300B") == 300e9
    assert parse_count("1.5T") == 1.5e12
    assert parse_count("70m") == 70e6
    assert parse_count("7e9") == 7e9
    with pytest.raises(ValueError, match="e.g. 300B"):
        parse_count("lots")


def test_young_and_daly_by_hand():
    # d = 7.8231096 s, M = 144000 s: Young sqrt(2 * 7.8231096 * 144000) = sqrt(2253055.6)
    # = 1501.0182. Daly: x = d / 2M = 2.716358e-5, sqrt(x) = 0.00521187;
    # 1501.0182 * (1 + 0.00173729 + 0.00000302) - 7.8231 = 1503.6304 - 7.8231 = 1495.8073
    assert young_interval(7.8231096, 144000) == pytest.approx(1501.0182, abs=1e-3)
    assert daly_interval(7.8231096, 144000) == pytest.approx(1495.8073, abs=1e-3)
    # d = 1, M = 1000: sqrt(2000) = 44.72136 * (1 + 0.0074536 + 0.0000556) - 1 = 44.05718
    assert daly_interval(1, 1000) == pytest.approx(44.05718, abs=1e-4)
    # a stall of 2M or more: Daly's interval is M
    assert daly_interval(2000, 1000) == 1000


def test_brief_run_sizes_for_each_assumption():
    # 14 B/param: 300e9 * 14 = 4.2e12 B = 4.2 TB; / 125 hosts = 33.6e9 B per host
    r = plan(brief_run())
    assert r.hosts == 125
    assert r.bytes_per_param == 14
    assert r.size_bytes == pytest.approx(4.2e12)
    assert r.size_per_host_bytes == pytest.approx(33.6e9)
    # 12 B/param (fp32 master saved as the weights + fp32 m, v): 3.6 TB, the brief's ~3.5 TB
    r12 = plan(brief_run(weight_bytes=4, master_bytes=0))
    assert r12.size_bytes == pytest.approx(3.6e12)
    assert r12.size_per_host_bytes == pytest.approx(28.8e9)
    # 10 B/param (bf16 weights + fp32 m, v, no master): 3.0 TB
    assert plan(brief_run(master_bytes=0)).size_bytes == pytest.approx(3.0e12)


def test_brief_run_stalls_intervals_and_losses():
    r = plan(brief_run())
    # sync stall 33.6e9 / (4 * 1073741824) = 7.8231 s; async 33.6e9 / (40 * 1073741824) = 0.78231 s
    assert r.write_s == pytest.approx(7.8231096, abs=1e-6)
    assert r.snapshot_s == pytest.approx(0.78231096, abs=1e-7)
    assert r.load_s == pytest.approx(7.8231096, abs=1e-6)  # read defaults to the write bandwidth
    assert r.restart_total_s == pytest.approx(607.8231, abs=1e-3)
    assert r.job_mtbf_s == 144000
    sync, async_ = r.modes
    assert sync.young_interval_s == pytest.approx(1501.0182, abs=1e-3)
    assert sync.interval_s == pytest.approx(1495.8073, abs=1e-3)
    # async: Young sqrt(2 * 0.78231 * 144000) = 474.6636; Daly 474.1422 (> write 7.82 s)
    assert async_.young_interval_s == pytest.approx(474.6636, abs=1e-3)
    assert async_.interval_s == pytest.approx(474.1422, abs=1e-3)
    assert r.recommended == "async"
    # lost per failure, sync: (1495.8073 + 7.8231) / 2 + 607.8231 = 1359.6383 s
    assert sync.lost_per_failure_s == pytest.approx(1359.6383, abs=1e-3)
    # async: (474.1422 + 0.7823) / 2 + 7.8231 (background write) + 607.8231 = 853.1085 s
    assert async_.lost_per_failure_s == pytest.approx(853.1085, abs=1e-3)
    # wall, sync: 5184000 * (1 + 7.8231 / 1495.8073) / (1 - 1359.6383 / 144000)
    #           = 5184000 * 1.00523000 / 0.99055807 = 5260784 s (60.89 days), 36.53 failures
    assert sync.expected_wall_s == pytest.approx(5260784.4, abs=0.1)
    assert sync.expected_failures == pytest.approx(36.5332, abs=1e-3)
    assert sync.efficiency == pytest.approx(0.985404, abs=1e-6)  # 5184000 / 5260784.4


def test_mtbf_per_job_is_used_as_given():
    r = plan(brief_run(mtbf_s=40 * H, mtbf_per="job"))
    assert r.job_mtbf_s == 144000
    assert r.modes[0].interval_s == pytest.approx(1495.8073, abs=1e-3)


def test_async_interval_covers_the_background_write():
    # 1 host, 2^32 params * 16 B = 64 GiB; write 0.5 GiB/s -> 128 s; snapshot 64 GiB/s -> 1 s.
    # M = 1000 s: Daly(1, 1000) = 44.06 s < 128 s, so the async interval is 128 s.
    r = plan(
        PlanInputs(
            params=2**32,
            gpus=8,
            weight_bytes=4,
            optimizer_bytes=8,
            master_bytes=4,
            write_gib_s=0.5,
            snapshot_gib_s=64,
            mtbf_s=1000,
            run_s=10 * H,
            restart_s=0,
        )
    )
    async_ = r.modes[1]
    assert r.write_s == 128 and async_.stall_s == 1
    assert async_.daly_interval_s == pytest.approx(44.05718, abs=1e-4)
    assert async_.interval_s == 128
    # (128 + 1) / 2 + 128 + load 128 = 320.5 s per failure
    assert async_.lost_per_failure_s == pytest.approx(320.5)


def test_failures_outpacing_progress_give_infinite_wall_time():
    r = plan(brief_run(mtbf_s=500, mtbf_per="job", snapshot_gib_s=None, run_s=D))
    assert len(r.modes) == 1 and r.recommended == "sync"
    assert math.isinf(r.modes[0].expected_wall_s) and r.modes[0].efficiency == 0


def test_footprint_keep_all_by_hand():
    # saves of 100 B at 1h..10h; stored 0 on [0,1h), 100 on [1h,2h) ... 900 on [9h,10h)
    fp = simulate_footprint(100, None, 1, H, 0, 10 * H, None)
    assert fp.saves == 10
    assert fp.peak_bytes == 1000 and fp.final_bytes == 1000 and fp.final_kept == 10
    assert fp.average_bytes == pytest.approx(100 * 45 / 10)  # 450


def test_footprint_keep_last_two_by_hand():
    # after each GC at most 2 kept; the peak (3 x 100) is right after a save, before its GC.
    # stored: 0 on [0,1h), 100 on [1h,2h), 200 on [2h,10h): average (100 + 8 * 200) / 10 = 170
    fp = simulate_footprint(100, None, 1, H, 0, 10 * H, "last=2")
    assert fp.peak_bytes == 300 and fp.final_bytes == 200
    assert fp.peak_kept == 2 and fp.final_kept == 2
    assert fp.average_bytes == pytest.approx(170)
    # the kept count after each GC, sampled (every save here: fewer than 100 saves)
    assert fp.timeline == [(1 * H, 1, 100)] + [(k * H, 2, 200) for k in range(2, 11)]


def test_footprint_deltas_keep_their_base():
    # full 100 every 3rd save, deltas 10. last=1: save 2 keeps base 1 (110), save 3 (delta on
    # 1) peaks at 120 then drops delta 2 (110), save 4 is full: 210 before GC, 100 after.
    fp = simulate_footprint(100, 10, 3, H, 0, 4 * H, "last=1")
    assert fp.peak_bytes == 210 and fp.final_bytes == 100 and fp.final_kept == 1
    # stored 0, 100, 110, 110 over the four hours: average 80
    assert fp.average_bytes == pytest.approx(80)


def test_footprint_counts_stalls_and_best_reserve():
    # interval 1h + stall 0.5h: saves commit at 1.5h and 3h; run ends at 2h compute + 1h stall.
    # best=loss:min:2 -> up to 2 full checkpoints on top (capped by the number deleted: 1).
    fp = simulate_footprint(100, None, 1, H, 0.5 * H, 2 * H, "last=1,best=loss:min:2")
    assert fp.saves == 2
    assert fp.peak_bytes == 200  # save 2 before GC, nothing deleted yet
    assert fp.final_bytes == 200 and fp.best_reserve_bytes == 100
    # stored 0 on [0, 1.5h), 100 on [1.5h, 3h): average 50 (end = 3h)
    assert fp.average_bytes == pytest.approx(50)


def test_footprint_with_thinning_over_thirty_days_by_hand():
    # hourly saves k = 1..720, now = 720 h. all tier (< 1d): k 697..720 (24); 1d tier: k
    # 553..696, newest per day: 575, 599, 623, 647, 671, 695, 696 (7); 7d tier, k <= 552:
    # newest per 7 days: 167, 335, 503, 552 (4). 35 kept.
    fp = simulate_footprint(1, None, 1, H, 0, 720 * H, "thin=1d:all/7d:1d/*:7d")
    assert fp.saves == 720 and fp.final_kept == 35 and fp.final_bytes == 35


def test_cost_by_hand():
    # keep all, 10 saves of a 1 TB checkpoint (params 1e11 * 10 B), one host, no failures to
    # speak of; 0.02 per GB-month: peak 10 TB = 10000 GB -> 200 per month
    r = plan(
        PlanInputs(
            params=1e11,
            gpus=8,
            write_gib_s=1,
            mtbf_s=1e12,
            run_s=10 * H,
            interval_s=H,
            price_gb_month=0.02,
        )
    )
    assert r.size_bytes == 1e12 and r.footprint.saves == 10
    assert r.cost_month_peak == pytest.approx(200)
    assert r.cost_month_average == pytest.approx(r.footprint.average_bytes / 1e9 * 0.02)
    months = r.modes[0].expected_wall_s / (730 * H)
    assert r.cost_run == pytest.approx(r.cost_month_average * months)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"gpus": 0}, "gpus must be positive"),
        ({"mtbf_per": "rack"}, "'job' or 'node'"),
        ({"full_every": 4}, "needs delta_ratio"),
        ({"policy": "keep=1"}, "unknown policy item"),
    ],
)
def test_bad_inputs_name_the_fix(overrides, message):
    with pytest.raises(ValueError, match=message):
        brief_run(**overrides)


BRIEF_ARGV = [
    "--params=300B",
    "--weights=bf16",
    "--master=fp32",
    "--gpus=1000",
    "--write-gib-s=4",
    "--snapshot-gib-s=40",
    "--mtbf=5000h",
    "--mtbf-per=node",
    "--restart=10m",
    "--run-length=60d",
    "--policy=last=5,thin=2h:all/1d:1h/7d:1d/*:7d",
    "--interval=1h",
]


def test_cli_json_matches_the_hand_computed_plan(capsys):
    assert cli.main(["plan", *BRIEF_ARGV, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["size_bytes"] == pytest.approx(4.2e12)
    assert out["size_per_host_bytes"] == pytest.approx(33.6e9)
    assert out["modes"][0]["interval_s"] == pytest.approx(1495.8073, abs=1e-3)
    assert out["recommended"] == "async"
    # 60 days at 1h (+0.78 s stall): 1440 saves. At the end about 5 last + 22 hourly + 6-7
    # daily + 9 weekly are kept (the exact count is the retention module's, checked by hand in
    # test_footprint_with_thinning_over_thirty_days_by_hand); here: bounded, far below 1440
    fp = out["footprint"]
    assert fp["saves"] == 1440
    assert 30 <= fp["final_kept"] <= 45
    assert fp["final_bytes"] == pytest.approx(fp["final_kept"] * 4.2e12)


def test_cli_table_and_errors(capsys):
    assert plan_cli.main(BRIEF_ARGV) == 0
    out = capsys.readouterr().out
    assert "4.20 TB (3.82 TiB)" in out
    assert "33.60 GB (31.29 GiB)" in out
    assert "24.9 min" in out  # Daly, sync
    assert "<- recommended" in out
    assert (
        plan_cli.main(
            ["--params=1B", "--gpus=8", "--write-gib-s=1", "--mtbf=1y"] + ["--run-length=1d"]
        )
        == 2
    )
    assert "bad duration '1y'" in capsys.readouterr().err


# -- RPO / RTO (docs/planner.md "RPO and RTO") ---------------------------------------------------
def reference_case(**overrides) -> PlanInputs:
    """The issue's reference case: 300B parameters on 1,000 GPUs (125 hosts), fp32 master as the
    weights + fp32 m, v = 12 B/param = 3.6 TB (the brief's ~3.5 TB), 28.8 GB per host; 4 GiB/s
    write and 40 GiB/s snapshot per host; hourly saves."""
    return brief_run(weight_bytes=4, master_bytes=0, interval_s=3600.0, **overrides)


def test_rpo_rto_of_the_reference_case_by_hand():
    r = plan(reference_case())
    assert r.size_bytes == pytest.approx(3.6e12) and r.size_per_host_bytes == pytest.approx(28.8e9)
    v = r.recovery
    # d_async = 28.8e9 / (40 * 2^30) = 0.67055225 s; W = 28.8e9 / (4 * 2^30) = 6.70552253 s
    assert v.stall_s == pytest.approx(0.67055225) and v.background_s == pytest.approx(6.70552253)
    # expected (3600 + 0.67055) / 2 + 6.70552 = 1807.0408 s; worst 3600 + 0.67055 + 6.70552
    assert v.rpo_expected_s == pytest.approx(1807.0408, abs=1e-3)
    assert v.rpo_worst_s == pytest.approx(3607.3761, abs=1e-3)
    # RTO: the 10 min restart split 1 : 5 : 4 (60 s, 300 s, 240 s) + load 6.70552 s (read = write)
    assert (v.detect_s, v.reschedule_s, v.warmup_s) == pytest.approx((60, 300, 240))
    assert v.load_s == pytest.approx(6.70552253) and v.rto_s == pytest.approx(606.7055, abs=1e-3)
    assert v.lost_over_run_s == pytest.approx(1807.0408 * r.modes[-1].expected_failures, rel=1e-6)
    assert v.feasible and v.interval_needed_s is None and v.read_gib_s_needed is None


def test_rpo_rto_targets_solve_interval_and_read_bandwidth_by_hand():
    v = plan(
        reference_case(rpo_s=1800.0, rto_s=600.0, detect_s=30, reschedule_s=120, warmup_s=120)
    ).recovery
    # interval: 1800 - 0.67055 (stall) - 6.70552 (background write) = 1792.6239 s
    assert v.interval_needed_s == pytest.approx(1792.6239, abs=1e-3)
    # read: 28.8e9 B / (600 - 30 - 120 - 120 = 330 s) = 87.27e6 B/s = 0.0812794 GiB/s per host
    assert v.read_gib_s_needed == pytest.approx(0.0812794, abs=1e-6)
    assert v.feasible and v.rto_s == pytest.approx(270 + 6.70552, abs=1e-3)


def test_rpo_rto_targets_that_cannot_be_met_say_why():
    # default parts: 60 + 300 + 240 = 600 s already fill a 10 min RTO
    v = plan(reference_case(rpo_s=1800.0, rto_s=600.0)).recovery
    assert not v.feasible and len(v.problems) == 1
    assert "RTO 10.0 min cannot be met at any read bandwidth" in v.problems[0]
    # async needs tau >= W, so RPO > 0.67 + 2 x 6.71 = 14.08 s; sync needs RPO > d = 6.71 s
    v = plan(reference_case(rpo_s=10.0)).recovery
    assert not v.feasible and "must exceed 14.1 s" in v.problems[0]
    v = plan(reference_case(rpo_s=5.0, snapshot_gib_s=None)).recovery
    assert v.stall_s == pytest.approx(6.70552253) and "must exceed 6.7 s" in v.problems[0]
    assert plan(reference_case(rpo_s=15.0)).recovery.interval_needed_s == pytest.approx(
        15 - 0.67055225 - 6.70552253
    )
    with pytest.raises(ValueError, match="restart cost or its parts"):
        reference_case(restart_s=300, detect_s=10)


def test_cli_rpo_rto(capsys):
    ref = ["--params=300B", "--weights=fp32", "--gpus=1000", "--write-gib-s=4"]
    ref += ["--snapshot-gib-s=40", "--mtbf=5000h", "--mtbf-per=node", "--run-length=60d"]
    ref += ["--interval=1h", "--rpo=30m", "--rto=10m"]
    assert plan_cli.main(ref) == 1  # the default restart parts fill the RTO
    captured = capsys.readouterr()
    assert "CANNOT be met" in captured.out and "RTO 10.0 min cannot be met" in captured.err
    assert plan_cli.main([*ref, "--detect=30s", "--reschedule=2m", "--warmup=2m", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["recovery"]
    assert out["interval_needed_s"] == pytest.approx(1792.6239, abs=1e-3)
    assert out["read_gib_s_needed"] == pytest.approx(0.0812794, abs=1e-6)
    assert plan_cli.main([*ref, "--restart=5m", "--detect=1m"]) == 2
    assert "not both" in capsys.readouterr().err


def test_footprint_with_slim_by_hand():
    # 14 B/param checkpoints of size 14, weights 2 (ratio 1/7); saves at 1h..5h (no stall);
    # slim=90m shrinks a kept step older than 90 min to 2, never the latest:
    # k=3: 14*3 = 42 before, step 1 (2h old) slimmed -> 30; k=4: 44 -> 32; k=5: 46 -> 34
    fp = simulate_footprint(14.0, None, 1, 3600, 0.0, 5 * 3600, "last=10,slim=90m", None, 2 / 14)
    assert fp.saves == 5 and fp.final_kept == 5
    assert fp.final_bytes == pytest.approx(34.0) and fp.peak_bytes == pytest.approx(46.0)
    plain = simulate_footprint(14.0, None, 1, 3600, 0.0, 5 * 3600, "last=10", None, 2 / 14)
    assert plain.final_bytes == pytest.approx(70.0)


def test_brief_run_slim_after_7_days_saves_the_optimizer_of_weekly_checkpoints():
    policy = "last=5,thin=2h:all/1d:1h/7d:1d/*:7d"
    base = plan(brief_run(policy=policy, interval_s=3600.0)).footprint
    slim = plan(brief_run(policy=policy + ",slim=7d", interval_s=3600.0)).footprint
    # same checkpoints kept; those older than 7 days (the 7-day tier: 8 at the end, bases of
    # no delta) keep 2 of 14 B/param: 8 x 4.2 TB x 12/14 = 28.8 TB less
    assert slim.final_kept == base.final_kept
    assert base.final_bytes - slim.final_bytes == pytest.approx(28.8e12)


def test_a_preemption_save_that_outlasts_the_grace_period_is_warned_about():
    # async: the snapshot (33.6e9 / 40 GiB/s = 0.782 s) then the write (33.6e9 / 4 GiB/s =
    # 7.823 s) per host must commit between SIGTERM and SIGKILL
    r = plan(brief_run(grace_s=120))
    assert r.preempt_save_s == pytest.approx(33.6e9 / GIB / 40 + 33.6e9 / GIB / 4)
    assert r.warnings == []
    slow = plan(brief_run(grace_s=30, write_gib_s=0.5))  # 62.6 s of write + 0.8 s snapshot
    assert slow.preempt_save_s == pytest.approx(33.6e9 / GIB / 40 + 33.6e9 / GIB / 0.5)
    (warning,) = slow.warnings
    assert "about 63 s per host" in warning and "30 s between SIGTERM and SIGKILL" in warning
    assert "at least 77 s" in warning  # 63.4 x 1.2, rounded up
    assert plan(brief_run()).warnings == []  # no grace period given: nothing to check


def test_cli_grace_warning(capsys):
    assert plan_cli.main([*BRIEF_ARGV, "--grace=30s", "--write-gib-s=0.5"]) == 0
    out, err = capsys.readouterr()
    assert "preemption save" in out and "(too long!)" in out
    assert "warning: a preemption save takes about 63 s" in err
    assert plan_cli.main([*BRIEF_ARGV, "--grace=2m"]) == 0
    assert "(fits the grace period)" in capsys.readouterr().out


def test_plan_reports_the_footprint_simulation_s_progress():
    """`ckptflow plan` shows a bar while the saves are simulated: plan() must pass its
    progress on (it took the callback and never called it)."""
    seen = []
    plan(brief_run(), lambda done, total: seen.append((done, total)))
    assert seen and seen[-1][0] == seen[-1][1] > 0
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)

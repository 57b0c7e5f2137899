"""`ckptflow plan`: checkpoint size, save stall, interval and storage cost of a run.

Example (the brief's run: 300B parameters on 1,000 GPUs):

    ckptflow plan --params 300B --weights bf16 --master fp32 --gpus 1000 --gpus-per-host 8 \\
        --write-gib-s 4 --snapshot-gib-s 40 --mtbf 5000h --mtbf-per node --run-length 60d \\
        --policy last=5,thin=2h:all/1d:1h/7d:1d/*:7d --price-gb-month 0.02

Formulas: docs/planner.md.
"""

from __future__ import annotations

import argparse
import json
import sys

from ckptflow.contract import cli_args
from ckptflow.core.planner import (
    GIB,
    PlanInputs,
    PlanResult,
    parse_count,
    plan,
    precision_bytes,
)
from ckptflow.core.policy_syntax import PolicyError, parse_duration
from ckptflow.core.progress import Progress
from ckptflow.core.recovery import (
    DEFAULT_NODE_GRACE_S,
    DEFAULT_NODE_LOSS_TOLERATION_S,
    DEFAULT_PG_TIMEOUT_S,
    Recovery,
    gang_detect_s,
)


def build_parser() -> argparse.ArgumentParser:
    p = cli_args.Parser(
        prog="ckptflow plan",
        description="Size checkpoints, save stalls, the checkpoint interval and storage cost.",
        epilog="Durations take units s, m, h, d, w (e.g. 90m, 60d). Formulas: docs/planner.md.",
    )
    a = p.add_argument
    a("--params", required=True, help="model parameters, e.g. 300B, 7e9, 1.5T")
    a("--weights", default="bf16", help="saved weight precision or bytes/param (default bf16)")
    a("--optimizer-bytes", type=float, default=8.0, help="optimizer bytes/param (AdamW fp32: 8)")
    a("--master", default="none", help="saved master weights: none, fp32 or bytes/param")
    a("--gpus", type=int, required=True, help="GPUs in the job")
    a("--gpus-per-host", type=int, default=8, help="GPUs per host (default 8)")
    a("--write-gib-s", type=float, required=True, help="measured write GiB/s per host")
    a("--snapshot-gib-s", type=float, help="device-to-host GiB/s per host (enables async)")
    a("--read-gib-s", type=float, help="read GiB/s per host at restart (default: write)")
    a("--mtbf", required=True, help="mean time between failures, e.g. 48h")
    a("--mtbf-per", choices=("job", "node"), default="job", help="--mtbf is the job's or a host's")
    a("--restart", help="restart cost besides loading (default: its three parts below)")
    a(
        "--detect",
        help="restart part: failure noticed, every rank out (default: max(--pg-timeout, "
        "--node-grace + --node-loss-toleration); replaces --restart)",
    )
    a("--pg-timeout", help="the ranks' process-group timeout (pretrain.pg_timeout_s: 120s)")
    a("--node-grace", help="the cluster's node monitor grace period (platform: 50s)")
    a(
        "--node-loss-toleration",
        help="ranks' node-loss tolerationSeconds (platform.gpu_node_loss_toleration_s: 60s)",
    )
    a("--reschedule", help="restart part: pods back and rendezvoused (default 5m)")
    a("--warmup", help="restart part: loaded state to full speed (default 4m)")
    a("--rpo", help="target: worst-case work lost per failure, e.g. 30m (solves the interval)")
    a("--rto", help="target: failure to training again, e.g. 10m (solves the read bandwidth)")
    a("--run-length", required=True, help="training time without failures or saves, e.g. 60d")
    a("--policy", help="retention policy, e.g. last=5,thin=2h:all/1d:1h (default: keep all)")
    a("--delta-ratio", type=float, help="stored delta size / full size")
    a("--full-every", type=int, default=1, help="every Nth save is full (needs --delta-ratio)")
    a("--price-gb-month", type=float, default=0.02, help="storage price per GB-month (0.02)")
    a("--interval", help="simulate this interval instead of the recommended one, e.g. 30m")
    a("--grace", help="pods' terminationGracePeriodSeconds, e.g. 120s: warn if a save is longer")
    a(
        "--local-interval",
        help="the local tier: compute time between local saves (pretrain.local_every x step "
        "time), e.g. 2m; 0 or absent: off",
    )
    a("--replicas", type=int, default=0, help="local tier: copies on other hosts (default 0)")
    a("--local-write-gib-s", type=float, help="local tier: disk write GiB/s per host (--write)")
    a("--local-read-gib-s", type=float, help="local tier: disk read GiB/s per host (local write)")
    a("--peer-gib-s", type=float, help="local tier: host-to-host GiB/s (default: local write)")
    a("--json", action="store_true", help="print JSON instead of a table")
    return p


def _duration_or_zero(text: str) -> float:
    """A duration, where '0' (with or without a unit) means none."""
    return 0.0 if text.strip().rstrip("smhdw") in ("0", "0.0") else parse_duration(text)


def _optional(text: str | None, zero_ok: bool = True) -> float | None:
    """An optional duration ('0' allowed where `zero_ok`)."""
    if text is None:
        return None
    return _duration_or_zero(text) if zero_ok else parse_duration(text)


def inputs_from_args(args: argparse.Namespace) -> PlanInputs:
    """PlanInputs from parsed arguments (raises ValueError with the fix on bad input)."""
    parts = (args.detect, args.reschedule, args.warmup)
    if args.restart is not None and any(p is not None for p in parts):
        raise ValueError("give --restart or its parts (--detect, --reschedule, --warmup), not both")
    settings = (args.pg_timeout, args.node_grace, args.node_loss_toleration)
    if any(v is not None for v in settings) and (args.detect or args.restart) is not None:
        raise ValueError(
            "--pg-timeout, --node-grace and --node-loss-toleration compute the detection: "
            "give them or --detect/--restart, not both"
        )
    return PlanInputs(
        params=parse_count(args.params),
        gpus=args.gpus,
        write_gib_s=args.write_gib_s,
        mtbf_s=parse_duration(args.mtbf),
        run_s=parse_duration(args.run_length),
        weight_bytes=precision_bytes(args.weights),
        optimizer_bytes=args.optimizer_bytes,
        master_bytes=precision_bytes(args.master),
        gpus_per_host=args.gpus_per_host,
        mtbf_per=args.mtbf_per,
        snapshot_gib_s=args.snapshot_gib_s,
        read_gib_s=args.read_gib_s,
        restart_s=_duration_or_zero(args.restart or "10m"),
        detect_s=_optional(args.detect) if args.restart or args.detect else detect_from(args),
        reschedule_s=_optional(args.reschedule),
        warmup_s=_optional(args.warmup),
        rpo_s=_optional(args.rpo, zero_ok=False),
        rto_s=_optional(args.rto, zero_ok=False),
        policy=args.policy,
        delta_ratio=args.delta_ratio,
        full_every=args.full_every,
        price_gb_month=args.price_gb_month,
        interval_s=parse_duration(args.interval) if args.interval else None,
        grace_s=parse_duration(args.grace) if args.grace else None,
        local_interval_s=_optional(args.local_interval) or None,  # 0: off
        replicas=args.replicas,
        local_write_gib_s=args.local_write_gib_s,
        local_read_gib_s=args.local_read_gib_s,
        peer_gib_s=args.peer_gib_s,
    )


def detect_from(args: argparse.Namespace) -> float:
    """The detection the ranks' settings give (recovery.gang_detect_s), defaults filled in."""
    return gang_detect_s(
        DEFAULT_PG_TIMEOUT_S if args.pg_timeout is None else parse_duration(args.pg_timeout),
        DEFAULT_NODE_GRACE_S if args.node_grace is None else _duration_or_zero(args.node_grace),
        DEFAULT_NODE_LOSS_TOLERATION_S
        if args.node_loss_toleration is None
        else _duration_or_zero(args.node_loss_toleration),
    )


def fmt_bytes(n: float) -> str:
    """Decimal and binary units side by side: '4.20 TB (3.82 TiB)'."""
    for unit, dec, binary in (("T", 1e12, 2**40), ("G", 1e9, GIB), ("M", 1e6, 2**20)):
        if n >= dec:
            return f"{n / dec:.2f} {unit}B ({n / binary:.2f} {unit}iB)"
    return f"{n:.0f} B"


def fmt_seconds(s: float | None) -> str:
    """A duration in the largest fitting unit: '7.8 s', '24.9 min', '1.7 h', '61.0 d'."""
    if s is None:
        return "n/a"
    if s == float("inf"):
        return "never (failures outpace progress)"
    for unit, width in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= 2 * width:
            return f"{s / width:.1f} {unit}"
    return f"{s:.1f} s"


def render(r: PlanResult) -> str:
    """The plan as an aligned two-column table."""
    fp = r.footprint
    inp = r.inputs
    rows: list[tuple[str, str]] = [
        ("hosts", f"{r.hosts} ({inp['gpus']} GPUs, {inp['gpus_per_host']} per host)"),
        ("bytes per parameter", f"{r.bytes_per_param:g}"),
        ("checkpoint size", fmt_bytes(r.size_bytes)),
        ("  per host", fmt_bytes(r.size_per_host_bytes)),
    ]
    if r.delta_bytes is not None:
        rows.append(("  delta checkpoint", fmt_bytes(r.delta_bytes)))
    rows += [
        ("stall, sync (write)", fmt_seconds(r.write_s)),
        ("stall, async (snapshot)", fmt_seconds(r.snapshot_s)),
        ("restart (fixed + load)", fmt_seconds(r.restart_total_s)),
        ("job MTBF", fmt_seconds(r.job_mtbf_s)),
    ]
    for m in r.modes:
        mark = "  <- recommended" if m.mode == r.recommended else ""
        rows += [
            (f"[{m.mode}] interval Young", fmt_seconds(m.young_interval_s)),
            (f"[{m.mode}] interval Daly", fmt_seconds(m.daly_interval_s)),
            (f"[{m.mode}] interval", fmt_seconds(m.interval_s) + mark),
            (f"[{m.mode}] work lost/failure", fmt_seconds(m.lost_per_failure_s)),
            (f"[{m.mode}] failures expected", f"{m.expected_failures:.1f}"),
            (f"[{m.mode}] wall time", fmt_seconds(m.expected_wall_s)),
            (f"[{m.mode}] efficiency", f"{100 * m.efficiency:.2f} %"),
        ]
    rows += [
        ("policy", inp["policy"] or "keep all"),
        ("saves simulated", f"{fp.saves} every {fmt_seconds(fp.interval_s)}"),
        ("storage peak", f"{fmt_bytes(fp.peak_bytes)}, {fp.peak_kept} checkpoints"),
        ("storage average", fmt_bytes(fp.average_bytes)),
        ("storage at end", f"{fmt_bytes(fp.final_bytes)}, {fp.final_kept} checkpoints"),
        ("cost/month at peak", f"{r.cost_month_peak:,.2f} (at {inp['price_gb_month']:g}/GB)"),
        ("cost/month average", f"{r.cost_month_average:,.2f}"),
        ("cost over the run", f"{r.cost_run:,.2f}"),
    ]
    if fp.best_reserve_bytes:
        rows.append(("  keep-best reserve", fmt_bytes(fp.best_reserve_bytes)))
    if r.recovery is not None:
        rows += recovery_rows(r.recovery)
    grace = inp.get("grace_s")
    fits = "" if grace is None else (" (too long!)" if r.warnings else " (fits the grace period)")
    rows.append(("preemption save", fmt_seconds(r.preempt_save_s) + fits))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def recovery_rows(v: Recovery) -> list[tuple[str, str]]:
    """RPO and RTO at the plan's interval, then what the targets need (docs/planner.md)."""
    rows = [
        ("RPO expected", f"{fmt_seconds(v.rpo_expected_s)} at {fmt_seconds(v.interval_s)}"),
        ("RPO worst case", fmt_seconds(v.rpo_worst_s)),
        ("lost work over the run", fmt_seconds(v.lost_over_run_s)),
        ("RTO", fmt_seconds(v.rto_s)),
        (
            "  detect+resched+load+warm",
            " + ".join(fmt_seconds(x) for x in (v.detect_s, v.reschedule_s, v.load_s, v.warmup_s)),
        ),
    ]
    if v.local_interval_s is not None:
        where = (
            f"local tier, {v.replicas} replica(s): own copies, a lost host's from a peer"
            if v.source == "peer"
            else "object storage (no replicas: a lost host's pieces are gone)"
        )
        rows += [
            ("node loss resumes from", where),
            ("  read from object storage", f"{fmt_bytes(v.store_bytes)} per host"),
        ]
    if v.rpo_target_s is not None and v.interval_needed_s is not None:
        needed = fmt_seconds(v.interval_needed_s) if v.interval_needed_s > 0 else "none"
        what = "local interval" if v.source == "peer" else "interval"
        rows.append((f"{what} for RPO {fmt_seconds(v.rpo_target_s)}", f"<= {needed}"))
    if v.rto_target_s is not None and v.read_gib_s_needed is not None:
        bw = v.read_gib_s_needed
        text = f">= {bw:.3g} GiB/s per host" if bw != float("inf") else "none suffices"
        rows.append((f"read for RTO {fmt_seconds(v.rto_target_s)}", text))
    if v.rpo_target_s is not None or v.rto_target_s is not None:
        rows.append(("targets", "can be met" if v.feasible else "CANNOT be met"))
        rows += [("  why", why) for why in v.problems]
    return rows


# options whose value may start with "-" (a negative number or duration, refused with its fix)
_VALUE_OPTIONS = {
    "--params",
    "--weights",
    "--optimizer-bytes",
    "--master",
    "--gpus",
    "--gpus-per-host",
    "--write-gib-s",
    "--snapshot-gib-s",
    "--read-gib-s",
    "--mtbf",
    "--restart",
    "--detect",
    "--pg-timeout",
    "--node-grace",
    "--node-loss-toleration",
    "--reschedule",
    "--warmup",
    "--rpo",
    "--rto",
    "--run-length",
    "--delta-ratio",
    "--full-every",
    "--price-gb-month",
    "--interval",
    "--grace",
    "--local-interval",
    "--replicas",
    "--local-write-gib-s",
    "--local-read-gib-s",
    "--peer-gib-s",
}


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, plan, print a table (or JSON with --json)."""
    args = cli_args.parse(build_parser(), argv, _VALUE_OPTIONS)
    if isinstance(args, int):  # argparse already printed the problem (or the help)
        return args
    try:
        # tqdm on a terminal, a plain line every 10 s elsewhere (a long simulation only)
        with Progress(0, desc="simulating saves", unit="save") as bar:
            result = plan(inputs_from_args(args), lambda done, total: bar.add(done - bar.n, total))
    except (ValueError, PolicyError) as exc:
        print(f"ckptflow plan: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True, default=str))
    else:
        print(render(result))
    for warning in result.warnings:
        print(f"ckptflow plan: warning: {warning}", file=sys.stderr)
    if result.recovery is not None and not result.recovery.feasible:
        for why in result.recovery.problems:
            print(f"ckptflow plan: {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

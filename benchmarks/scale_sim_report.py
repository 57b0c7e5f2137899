"""The v5 (per-rank manifests) part of benchmarks/scale_sim.py's docs section: its phases per
world size, their growth over ranks, and the 1,024-rank figures beside v4's (before/after)."""

from __future__ import annotations

import math
import statistics

TARGET_S, TARGET_WRITTEN = 1.0, 64 << 20  # rank-0 time and manifest bytes at 1,024 ranks
GROWTH_LIMIT = 1.1  # "linear or better": a slope of 1.0, with 0.1 for this host's noise

V5_PHASES = (
    ("own_plan_s", "rank 0's own plan time"),
    ("rank_manifest_s", "rank 0's rank manifest time"),
    ("coord_s", "rank 0's coordination time (gather, index, COMMIT)"),
    ("rank0_s", "rank-0 total time"),
    ("rank_manifest_bytes", "rank 0's rank manifest bytes"),
    ("index_bytes", "index bytes"),
    ("rank0_written_bytes", "bytes rank 0 writes (rank manifest + index)"),
    ("load_plan_s", "one rank's load planning time"),
    ("load_plan_peak", "one rank's load planning peak memory"),
)


def slope(xs, ys) -> float | None:
    """Least-squares slope of log(y) over log(x) (points with y <= 0 left out)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if y > 0]
    if len(pts) < 2:
        return None
    mx = statistics.fmean(p[0] for p in pts)
    my = statistics.fmean(p[1] for p in pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else None


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.1f}"


def _kib(n: float) -> str:
    return f"{n / (1 << 10):.1f}"


def v5_table(rows: list[dict], title: str) -> list[str]:
    head = (
        "| ranks | chunks (all ranks) | own plan s | rank manifest s | own check s | "
        "coordination s | rank-0 total s | rank-0 peak MiB (plan/manifest/coordination) | "
        "rank 0's rank manifest MiB | index KiB | gathered KiB | own check requests | "
        "load plan s (1 rank) | load plan peak MiB | load reads MiB |"
    )
    lines = [title, "", head, "| " + " | ".join(["---"] * 15) + " |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['ranks']} | not measured: {r['error'][:160]} |" + " |" * 13)
            continue
        lines.append(
            f"| {r['ranks']} | {r['chunks']:,} | {r['own_plan_s']:.3f} | "
            f"{r['rank_manifest_s']:.3f} | {r['own_check_s']:.3f} | {r['coord_s']:.3f} | "
            f"{r['rank0_s']:.3f} | {_mib(r['own_plan_peak'])}/{_mib(r['rank_manifest_peak'])}/"
            f"{_mib(r['coord_peak'])} | {_mib(r['rank_manifest_bytes'])} | "
            f"{_kib(r['index_bytes'])} | {_kib(r['gather_bytes'])} | "
            f"{r['own_check_requests']:,} | {r['load_plan_s']:.3f} | "
            f"{_mib(r['load_plan_peak'])} | {_mib(r['load_read_bytes'])} |"
        )
    return lines + [""]


def growth(rows: list[dict]) -> tuple[list[str], dict]:
    """The slopes of the v5 phases over ranks (tensors fixed), as table lines."""
    ok = [r for r in rows if "error" not in r]
    lines = ["| v5 growth over ranks, full model (log-log slope; 1.0 = linear) | value |"]
    lines += ["| --- | --- |"]
    slopes = {}
    for key, what in V5_PHASES:
        k = slopes[key] = slope([r["ranks"] for r in ok], [r[key] for r in ok])
        lines.append(f"| {what} | {'' if k is None else f'{k:.2f}'} |")
    return lines + [""], slopes


def before_after(v4: dict, v5_rows: list[dict], slopes: dict) -> list[str]:
    """The 1,024-rank, full-model figures of v4 (`v4`: value, how) and v5, against the
    targets; v5 measured when its 1,024-rank row ran, else projected (and said so)."""
    ok = [r for r in v5_rows if "error" not in r]
    big = [r for r in ok if r["ranks"] == 1024]
    if not ok:
        return ["| 1,024 ranks, v5 | not measured | | |", ""]
    base = big[0] if big else ok[-1]
    how = "measured" if big else f"projected from {base['ranks']} ranks"

    def at(key: str) -> float:  # (a falling slope is taken as flat: no credit for noise)
        k = slopes.get(key)
        return base[key] * (1024 / base["ranks"]) ** (1.0 if k is None else max(k, 0.0))

    def v4s(key: str, unit: float) -> str:
        got = v4.get(key)
        return "" if got is None else f"{got[0] / unit:.1f} ({got[1]})"

    lines = [
        "| at 1,024 ranks, full model | v4 (one manifest) | v5 (per-rank manifests) | "
        "limit | v5 result |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key, v4key, what, lim, unit in (
        ("rank0_s", "rank0_s", "rank-0 time, s", TARGET_S, 1.0),
        ("rank0_written_bytes", "manifest_bytes", "manifest bytes rank 0 writes, MiB", 64, 1 << 20),
        (
            "load_read_bytes",
            "manifest_bytes",
            "manifest bytes one rank's load reads, MiB",
            None,
            1 << 20,
        ),
        ("load_plan_s", "load_plan_s", "one rank's load planning, s", None, 1.0),
        ("load_plan_peak", "load_plan_peak", "one rank's load planning peak, MiB", None, 1 << 20),
    ):
        got = at(key) / unit
        res = "" if lim is None else ("pass" if got <= lim else "**miss**")
        lines.append(f"| {what} | {v4s(v4key, unit)} | {got:.3f} ({how}) | {lim or ''} | {res} |")
    worst = max(
        (slopes[k] for k in ("rank0_s", "rank0_written_bytes", "load_plan_s") if slopes.get(k)),
        default=None,
    )
    if worst is not None:
        res = "pass" if worst <= GROWTH_LIMIT else "**miss**"
        lines.append(
            f"| growth over ranks (largest slope of rank-0 time, rank-0 bytes, load "
            f"planning) | | {worst:.2f} | {GROWTH_LIMIT} | {res} |"
        )
    return lines + [""]


WHY_V5 = """Under v5 no phase holds every rank's chunks: a rank plans, records and validates \
its own entries (under FSDP one chunk of each sharded tensor, whatever the world size, and \
the replicated tensors and values it holds: every rank writes those as its own, equal bytes \
to equal objects, and a merge keeps one), rank 0 adds one small record per rank to the index \
(what grows with ranks: the gather and the index, about 150 bytes a rank, linear; a few ms at \
1,024 ranks), and a load at the saved world size reads the index and its own rank manifest \
and plans its shards against them. The full model runs at every world size, 1,024 ranks \
included. Not timed here: the collectives themselves (the gather's bytes are above), and the \
parts' writes and reads."""


def section(v5_full: list[dict], v5_sweep: list[dict], v4_1024: dict, layers: str) -> str:
    """The v5 part of the docs section (markdown)."""
    proto = next((r["protocol"] for r in v5_full + v5_sweep if "protocol" in r), "not run")
    lines = [
        "### v5: per-rank manifests",
        "",
        f"Code timed: {proto}. Rank-0 time is rank 0's whole part of a save beyond writing "
        "its parts: its own plan, its rank manifest, its own objects' check and the "
        "coordination (v4's rank-0 time left out rank 0's own local plan).",
        "",
    ]
    lines += v5_table(v5_full, f"Full model ({layers}), every world size measured:")
    if v5_sweep:
        lines += v5_table(v5_sweep, "The sweep's smaller model (beside v4's sweep above):")
    g, slopes = growth(v5_full)
    lines += g + before_after(v4_1024, v5_full, slopes) + [WHY_V5]
    return "\n".join(lines) + "\n"

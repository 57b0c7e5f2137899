"""Simulated 64-1,024 ranks: what rank 0 does for a save, and one rank's load planning.

A script, not a test (issue 36 point 2):

    .venv/bin/python benchmarks/scale_sim.py                       # 64..1024 ranks
    .venv/bin/python benchmarks/scale_sim.py --ranks 64,128 --write-docs
    .venv/bin/python benchmarks/scale_sim.py --formats v5          # per-rank manifests only

Two protocols side by side: v4 (one manifest per step, rank 0 plans and records every chunk:
below) and v5 (per-rank manifests: benchmarks/scale_sim_v5.py says what is timed there).

No 1,024 processes: each rank's inputs are built directly, as that rank would hand them over,
and rank 0's (or one rank's) own code runs on them, the engine's real functions unchanged:

- model: a 300B-parameter GPT-like layout (93 layers, hidden 16,384, 12 tensors a layer,
  embeddings), fp32 weights with AdamW's exp_avg / exp_avg_sq and a replicated 0-dim `step`
  per parameter, and a few non-tensor values: 3,360 sharded tensors, 1,120 replicated ones;
- FSDP2: every tensor sharded on dim 0 over all ranks (torch.chunk's split: the last ranks
  of a small tensor may hold nothing), so a save has tensors x ranks chunks;
- each rank's local save plan (the WriteItems DCP's DefaultSavePlanner makes for a DTensor
  shard), pickled as DCP's gather sends it; each rank's write results (our writer's part
  records: parts of at most 64 MiB, parts under 1 MiB packed, fp32 stored as four planes).

Timed on rank 0 (medians of --repeats, CPU seconds: see measure(); peak memory is the process's peak RSS above its RSS
before the phase, /proc/self/clear_refs resetting the peak):

- plan: unpickle the gathered local plans, DCP's create_global_plan (our SafeSavePlanner),
  the writer's prepare_global_plan, pickle the scattered global plans;
- manifest: unpickle the gathered write results, build the manifest, serialise it,
  parse and validate it back (what CkptStorageWriter.finish does before it writes);
- commit: CkptStorageWriter.finish whole minus the manifest step above (it writes the
  manifest), pickle the Metadata DCP broadcasts back to every rank, then rank 0's part of
  commit.commit_together: its own objects checked present (on a store that answers from
  memory: the CPU of it; the requests it would cost an object store are counted), the
  commit marker claimed;
- load plan (the last rank, any would do): read, parse and validate the manifest, DCP
  Metadata from it, DCP's create_local_plan over the rank's DTensors (a fake process group
  of the simulated world size: torch.testing._internal.distributed.fake_pg).

Each world size runs in a process of its own (its peak memory is its own). Growth: the
least-squares slope of log(time) and log(memory) over log(ranks) (1.0: linear in ranks; the
tensors are fixed, so linear in ranks x tensors is a slope of 1).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from benchmarks import scale_sim_report, scale_sim_v5  # noqa: E402
from benchmarks.scale_sim_inputs import (  # noqa: E402
    dtensor_state,
    local_plan,
    model_layout,
    sim_storage,
    state_layout,
    write_results,
)
from benchmarks.scale_sim_report import slope  # noqa: E402

SECTION = "## Scale: simulated ranks, rank 0's save and one rank's load planning (issue 36)"
TARGET_S, TARGET_MANIFEST = 1.0, 64 << 20  # at 1,024 ranks (issue 36)


# -- phases -------------------------------------------------------------------------------------
def _rss() -> tuple[int, int]:
    """(current RSS, peak RSS) of this process in bytes."""
    got = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                got[line.split(":")[0]] = int(line.split()[1]) << 10
    return got["VmRSS"], got["VmHWM"]


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def measure(fn, repeats: int) -> tuple[float, int, object]:
    """(median CPU seconds, peak RSS above the start of the first run, last result) of fn().

    CPU seconds of this process (every phase runs on one thread): on a host shared with
    other jobs, its wall time measured the other jobs too (a phase took 5-10x as long at a
    load average of 11 on 2 cores); on an idle host the two are the same."""
    times, result, peak = [], None, 0
    for i in range(repeats):
        result = None
        _reset_peak()
        before = _rss()[0]
        t0 = time.process_time()
        result = fn()
        times.append(time.process_time() - t0)
        if i == 0:
            peak = max(0, _rss()[1] - before)
    return statistics.median(times), peak, result


def child(ranks: int, layers: int, repeats: int) -> dict:
    import gc

    import torch
    from ckptflow.steps.checkpoint import commit as commit_mod
    from ckptflow.steps.checkpoint.save_job import SaveJob
    from ckptflow.steps.checkpoint.save_manifest import build_manifest
    from ckptflow.steps.checkpoint.writer import CkptStorageWriter, SafeSavePlanner

    from ckptflow.core import manifest as mf

    torch.set_num_threads(1)
    lay = state_layout(layers)
    t0 = time.perf_counter()
    gathered = [pickle.dumps(local_plan(ranks, r, lay)) for r in range(ranks)]
    out = {
        "ranks": ranks,
        "tensors": len(lay[0]) + len(lay[1]),
        "chunks": len(lay[0]) * ranks + len(lay[1]),
        "gather_plan_bytes": sum(map(len, gathered)),
    }
    uri = f"memory://scale-sim-{os.getpid()}-{ranks}"

    def plan():
        planner = SafeSavePlanner()
        planner.set_up_planner({}, storage_meta=None, is_coordinator=True)
        plans = [pickle.loads(b) for b in gathered]
        plans, md = planner.create_global_plan(plans)
        job = SaveJob(storage=None, step=1, save_id="0" * 16, root_id="", world_size=ranks)
        plans = CkptStorageWriter(job).prepare_global_plan(plans)
        scattered = [pickle.dumps(p) for p in plans]
        return plans, md, sum(map(len, scattered))

    out["plan_s"], out["plan_peak"], (plans, md, out["scatter_plan_bytes"]) = measure(plan, repeats)
    gathered = None  # (freed: the results below are built without it)
    results = [pickle.dumps(write_results(p, r)) for r, p in enumerate(plans)]
    out["gather_results_bytes"] = sum(map(len, results))
    out["setup_s"] = time.perf_counter() - t0
    del plans
    gc.collect()
    job = SaveJob(storage=None, step=1, save_id="0" * 16, root_id="r" * 16, world_size=ranks)

    builds = []

    def manifest():
        flat = [wr for blob in results for wr in pickle.loads(blob)]
        t = time.process_time()
        m = build_manifest(job, md, flat)
        blob = mf.dumps(m)
        mf.validate(json.loads(blob))
        builds.append(time.process_time() - t)
        return flat, m, blob

    out["manifest_s"], out["manifest_peak"], (flat, m, blob) = measure(manifest, repeats)
    build_s = statistics.median(builds)
    out["manifest_bytes"], out["objects"] = len(blob), len(m["objects"])
    sizes = {k: v["size"] for k, v in m["objects"].items()}
    del m, blob
    gc.collect()
    stores = []

    # rank 0's own part records: what it checks before the marker (commit.py; any rank does)
    job.part_records = [p for wr in pickle.loads(results[0]) for p in wr.storage_data["parts"]]
    job.together = True  # as a Checkpointer saves (commit.commit_together)

    def commit():
        st = sim_storage(f"{uri}-{len(stores)}", sizes)
        stores.append(st)
        job.storage = st
        t = time.process_time()
        CkptStorageWriter(job).finish(md, [flat])  # writes the manifest
        n = len(pickle.dumps(md))  # DCP broadcasts the Metadata back to every rank
        commit_mod.commit_together(job, 0, 1, None)  # own objects checked, marker claimed
        return time.process_time() - t, n, st

    finish_s, out["commit_peak"], (_, out["broadcast_bytes"], st) = measure(commit, repeats)
    # finish builds the manifest too: that step is timed above, so it is taken out here
    out["commit_s"] = max(0.0, finish_s - build_s)
    out["check_requests"] = type(st).requests // repeats
    flat = results = None
    gc.collect()
    out.update(load_plan(st, ranks, lay, repeats))
    return out


def load_plan(st, ranks: int, lay, repeats: int) -> dict:
    """One rank's load planning (the last rank) over a fake process group of `ranks`."""
    import torch.distributed as dist
    from ckptflow.steps.checkpoint.reader import CkptStorageReader, SafeLoadPlanner
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from ckptflow.core import rootreader

    rank = ranks - 1
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=ranks)
    sd = dtensor_state(lay, ranks, rank)

    def plan():  # as Checkpointer._load_step: the rank's own entries validated and planned
        only = set(flatten_state_dict(sd)[0])
        m = rootreader.read_manifest(st, 1, only=only)
        md = CkptStorageReader(st, m, only=only).read_metadata()
        planner = SafeLoadPlanner()
        planner.set_up_planner(sd, md, is_coordinator=False)
        return planner.create_local_plan()

    s, peak, lp = measure(plan, repeats)
    dist.destroy_process_group()
    return {"load_plan_s": s, "load_plan_peak": peak, "load_items": len(lp.items)}


# -- the report ---------------------------------------------------------------------------------
def run_child(ranks: int, layers: int, repeats: int, v5: bool = False) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", str(ranks)]
    cmd += ["--layers", str(layers), "--repeats", str(repeats)] + (["--v5"] if v5 else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode or not lines:
        return {"ranks": ranks, "error": (p.stderr.strip().splitlines() or ["killed"])[-1]}
    return json.loads(lines[-1][7:])


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.1f}"


PHASES = (
    ("plan_s", "rank-0 plan time"),
    ("manifest_s", "manifest time"),
    ("commit_s", "commit time"),
    ("rank0_s", "rank-0 total time"),
    ("manifest_bytes", "manifest bytes"),
    ("manifest_peak", "manifest peak memory"),
    ("load_plan_s", "one rank's load planning time"),
    ("load_plan_peak", "one rank's load planning peak memory"),
)


def _table(rows: list[dict], layers: int, note: str = "") -> list[str]:
    params = sum(math.prod(s) for _, s in model_layout(layers))
    tensors = next((r["tensors"] for r in rows if "tensors" in r), "?")
    lines = [
        f"Model: {params / 1e9:.0f}B parameters ({layers} layers), {tensors} tensors{note}:",
        "",
        "| ranks | chunks | rank-0 plan s | manifest s | commit s | rank-0 total s | "
        "rank-0 peak MiB (plan/manifest/commit) | manifest MiB | objects | rank-0 check requests | "
        "gathered plans MiB | gathered results MiB | broadcast MiB | load plan s (1 rank) | "
        "load plan peak MiB |",
        "| " + " | ".join(["---"] * 15) + " |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['ranks']} | not measured: {r['error'][:160]} |" + " |" * 13)
            continue
        lines.append(
            f"| {r['ranks']} | {r['chunks']:,} | {r['plan_s']:.2f} | {r['manifest_s']:.2f} | "
            f"{r['commit_s']:.2f} | {r['rank0_s']:.2f} | {_mib(r['plan_peak'])}/"
            f"{_mib(r['manifest_peak'])}/{_mib(r['commit_peak'])} | {_mib(r['manifest_bytes'])}"
            f" | {r['objects']:,} | {r['check_requests']:,} | {_mib(r['gather_plan_bytes'])} | "
            f"{_mib(r['gather_results_bytes'])} | {_mib(r['broadcast_bytes'])} | "
            f"{r['load_plan_s']:.2f} | {_mib(r['load_plan_peak'])} |"
        )
    return lines + [""]


def report(
    full: list[dict], sweep: list[dict], layers: int, small: int, argv: str, v5=((), ())
) -> str:
    """The docs section: v4's tables, growth and 1,024-rank figures, then v5's (`v5`: its
    full-model and sweep rows) beside them."""
    v4_1024: dict = {}
    text = _report_v4(full, sweep, layers, small, argv, v4_1024)
    if not (v5[0] or v5[1]):
        return text
    params = sum(math.prod(s) for _, s in model_layout(layers))
    model = f"{params / 1e9:.0f}B parameters, {layers} layers"
    return text + "\n" + scale_sim_report.section(list(v5[0]), list(v5[1]), v4_1024, model)


def _report_v4(full, sweep, layers: int, small: int, argv: str, v4_1024: dict) -> str:
    for r in full + sweep:
        if "error" not in r:
            r["rank0_s"] = r["plan_s"] + r["manifest_s"] + r["commit_s"]
    ok_full = [r for r in full if "error" not in r]
    ok = [r for r in sweep if "error" not in r]
    lines = [
        SECTION,
        "",
        "Produced by " + " and ".join(map(_command, argv.split(";"))) + " (no process per rank:",
        "each rank's save plan and write results are built as that rank hands them over, and",
        "rank 0's code runs on them; one rank's load planning runs over a fake process group;",
        "benchmarks/scale_sim.py says how). FSDP2 layout: every tensor (fp32 weights, AdamW",
        "exp_avg and exp_avg_sq) sharded on dim 0 over all ranks. Seconds are medians on this",
        "shared 2-core host, in CPU seconds of the simulating process (each phase runs on",
        "one thread: on an idle host its wall time; the host's other jobs are left out);",
        "memory is the process's peak RSS above the phase's start. Check requests: what rank",
        "0's check of its own objects before the commit would cost an object store (HEADs,",
        "LIST pages of 1,000 keys; every rank checks its own alike).",
        f"Load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}.",
        "",
    ]
    lines += ["### v4: one manifest per step (format 4, before)", ""]
    lines += _table(full, layers, " (world sizes past --max-chunks are projected below)")
    lines += _table(sweep, small, ": the same layout, smaller, at every world size (growth)")
    lines += ["| growth over ranks, tensors fixed (log-log slope; 1.0 = linear) | value |"]
    lines += ["| --- | --- |"]
    slopes = {}
    for key, what in PHASES:
        slopes[key] = slope([r["ranks"] for r in ok], [r[key] for r in ok])
        k = slopes[key]
        lines.append(f"| {what} | {'' if k is None else f'{k:.2f}'} |")
    lines += ["", "| at 1,024 ranks, full model | measured or projected | limit | result |"]
    lines += ["| --- | --- | --- | --- |"]
    big = [r for r in ok_full if r["ranks"] == 1024]
    base = big[0] if big else (ok_full[-1] if ok_full else None)
    if base is None:
        lines.append("| 1,024 ranks | not measured | | |")
        return "\n".join(lines) + "\n"
    scale = 1024 / base["ranks"]
    how = "measured" if big else f"projected from {base['ranks']} ranks at the slopes above"

    def at(key: str) -> float:
        return base[key] * scale ** (slopes[key] or 1.0)

    for key, what, lim, unit in (
        ("rank0_s", "rank-0 time (plan + manifest + commit)", TARGET_S, 1.0),
        ("plan_s", "rank-0 plan", None, 1.0),
        ("manifest_s", "rank-0 manifest", None, 1.0),
        ("commit_s", "rank-0 commit", None, 1.0),
        ("manifest_peak", "rank-0 manifest peak memory, MiB", None, 1 << 20),
        ("manifest_bytes", "manifest, MiB", TARGET_MANIFEST >> 20, 1 << 20),
        ("load_plan_s", "one rank's load planning, s", None, 1.0),
        ("load_plan_peak", "one rank's load planning peak memory, MiB", None, 1 << 20),
    ):
        v4_1024[key] = (at(key), "measured" if big else "projected")
        got = at(key) / unit
        res = "" if lim is None else ("pass" if got <= lim else "**miss**")
        lines.append(f"| {what} ({how}) | {got:.1f} | {'' if lim is None else lim} | {res} |")
    chunks = base["chunks"] * scale
    per_chunk = 1e6 * base["rank0_s"] / base["chunks"]
    lines += ["", WHY.format(chunks=chunks, per_chunk=per_chunk, max_mib=MAX_MANIFEST_MIB)]
    return "\n".join(lines) + "\n"


MAX_MANIFEST_MIB = 512  # ckptflow.core.manifest.MAX_MANIFEST: a reader's bound
WHY = """What grows: every phase works per chunk (tensors x ranks), so each grows linearly in \
ranks x tensors (the slopes) at about {per_chunk:.0f} us of rank 0's CPU per chunk, and a \
300B FSDP2 state at 1,024 ranks has {chunks:,.0f} chunks. Rank 0 unpickles every rank's \
save plan (DCP's gather: most of the plan phase) and DCP builds its global plan and Metadata \
over every chunk; the manifest holds a record per chunk (about 460 bytes), built, \
serialised and parsed back whole by rank 0; every rank's load parses the whole manifest and \
DCP plans each of its shards against all of that tensor's chunks (under FSDP every rank \
holds a shard of every tensor, so loading only one's own entries saves nothing). Past \
{max_mib} MiB a manifest is refused by every reader (manifest.MAX_MANIFEST): such a save \
fails at its commit. The commit's check is a rank's own objects (a HEAD each), independent \
of the ranks. Meeting 1 s and 64 MiB needs rank 0 to do no per-chunk work (v5, below): each rank \
writing the records of its own chunks (a rank manifest), the step's manifest naming those \
and holding per-tensor metadata only, a save plan agreed without DCP's gather of every \
rank's items, and loads reading only the rank manifests whose chunks overlap their shards."""


def _at_commit() -> str:
    """ " | at <commit>" of this checkout (a "+" when files differ from it), or ""."""
    git = ["git", "-C", ROOT]
    try:
        sha = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(
            git + ["status", "--porcelain", "-uno"], capture_output=True, text=True
        )
    except OSError:
        return ""
    return f" | at {sha.stdout.strip()}{'+' if dirty.stdout.strip() else ''}" if sha.stdout else ""


def _command(run: str) -> str:
    args, _, at = run.partition(" | at ")
    where = f" (at {at})" if at else ""
    return f"`.venv/bin/python benchmarks/scale_sim.py {args}`{where}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="64,128,256,512,1024", help="world sizes, comma-separated")
    ap.add_argument("--layers", type=int, default=93, help="transformer layers (93: ~300B)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sweep-layers", type=int, default=6, help="the smaller model of the sweep")
    ap.add_argument(
        "--max-chunks",
        type=int,
        default=450_000,
        help="full-model world sizes with more chunks are projected, not run (memory)",
    )
    ap.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    ap.add_argument("--rows", help="report earlier runs' output (files, comma-separated)")
    ap.add_argument("--v5-repeats", type=int, default=5, help="repeats of the v5 phases")
    ap.add_argument("--formats", default="v4,v5", help="which protocols run: v4, v5 or both")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--v5", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    sys.path.insert(0, ROOT)
    if a.child:
        if a.v5:
            row = scale_sim_v5.child(a.child, a.layers, a.repeats, measure)
        else:
            row = child(a.child, a.layers, a.repeats)
        print("RESULT " + json.dumps(row), flush=True)
        return 0
    per_rank = len(state_layout(a.layers)[0])
    full_tensors = per_rank + len(state_layout(a.layers)[1])
    rows, commands = [], []
    # the JSON lines earlier runs printed (files, comma-separated): their report, nothing rerun
    for path in a.rows.split(",") if a.rows else []:
        with open(path) as f:
            lines = f.read().splitlines()
        rows += [json.loads(ln) for ln in lines if ln.startswith("{")]
        commands += [ln[4:] for ln in lines if ln.startswith("RUN ")]
    if not a.rows:
        commands = [" ".join(argv if argv is not None else sys.argv[1:]) + _at_commit()]
        print("RUN " + commands[0], flush=True)  # (what --rows says produced these rows)
    for n in [] if a.rows else [int(x) for x in a.ranks.split(",")]:
        runs = []
        if "v4" in a.formats:
            runs += [(a.layers, a.repeats, False)] if per_rank * n <= a.max_chunks else []
            runs += [(a.sweep_layers, a.repeats, False)]
        if "v5" in a.formats:
            runs += [(a.layers, a.v5_repeats, True), (a.sweep_layers, a.v5_repeats, True)]
        for layers, repeats, v5 in runs:
            rows.append(run_child(n, layers, repeats, v5))
            print(json.dumps(rows[-1] | ({"v5": True} if v5 else {})), flush=True)
    v5_rows = [r for r in rows if "protocol" in r or r.get("v5")]
    v4_rows = [r for r in rows if r not in v5_rows]
    full = [r for r in v4_rows if r.get("tensors") == full_tensors]
    sweep = [r for r in v4_rows if r not in full]
    v5_full = [r for r in v5_rows if r.get("tensors") == full_tensors]
    v5_sweep = [r for r in v5_rows if r not in v5_full]
    args = ";".join(commands) or "(rows of an unnamed run)"
    text = report(full, sweep, a.layers, a.sweep_layers, args, (v5_full, v5_sweep))
    print(text)
    if a.write_docs:
        from benchmarks import docs_section

        docs_section.write_section("scale-sim", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

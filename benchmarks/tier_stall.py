"""The stall of a local-tier save against a durable async save of the same state (issue 35).

    .venv/bin/python benchmarks/tier_stall.py [--mib 256] [--ranks 2] [--repeats 7]
                                              [--dir /var/tmp] [--docs]

A script, not a test. `--ranks` gloo processes on this host each hold their share of about
--mib MiB (random fp32 tensors of 16 MiB of their own, plus shared small values: a step and a
schedule, as a training state has), and save it in turns, side by side, into:

- local: `LocalTier.save` (tier/local_save.py): the async save into each rank's own root under
  --dir, then in the background the fan-out (every rank gets the manifest, COMMIT and the
  shared objects) and its PIECE, and retention (keep 2);
- durable: `Checkpointer.save(block=False)` into a durable root on the same disk (the
  durable async save a training loop makes).

Both have their snapshot buffers prepared first, as the training loop's are after its first
step; both compress as `auto` resolves on this disk (the local tier takes the durable root's
choice, local_save.compress_like). Before each save every tensor changes in place (an
optimizer step) and the ranks meet at a barrier; the stall is the time `save` held the calling
thread, the gang's being its slowest rank's; each save is waited for to the end before the
next (its background time is reported too, the fan-out included for the local tier), so a
stall is the snapshot's, not a wait for the save before. The order alternates per round.
Prints medians and the ratio local / durable per round; `--docs` writes the section
"Local tier: stall" of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

TENSOR_MIB = 16
KINDS = ("local", "durable", "control")


def rank_state(rank: int, world: int, mib: int) -> dict:
    """This rank's share: random fp32 tensors of TENSOR_MIB MiB, and the shared values."""
    g = torch.Generator().manual_seed(rank)
    n = max(1, mib // world // TENSOR_MIB)
    state = {f"r{rank}.t{i}": torch.randn(TENSOR_MIB << 18, generator=g) for i in range(n)}
    state["step"] = 0
    state["sched"] = {"lr": 1e-3, "last_epoch": 0}
    return state


def _worker(rank: int, world: int, port: int, args: dict, out: str) -> None:
    import torch.distributed as dist
    from ckptflow.steps.checkpoint import Checkpointer
    from ckptflow.steps.checkpoint.tier.local_save import LocalTier, compress_like

    from ckptflow.core import tier
    from tests.steps.distworkers import rank_env

    rank_env(rank, world, port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    state = rank_state(rank, world, args["mib"])
    durable = Checkpointer(args["durable"])
    local = LocalTier(
        args["local"], tier.run_key(durable.root), rank, world, compress=compress_like(durable)
    )
    control = Checkpointer(args["durable"] + "-control")  # made last: the noise floor
    for ck in (durable, local.ck, control):
        ck.prepare(state)
        ck._stager.wait_prepared()  # as the training's next steps run meanwhile
    rows = []
    step = 0
    for i in range(args["repeats"]):
        for kind in KINDS[i % 3 :] + KINDS[: i % 3]:  # each kind first, second, third
            step += 1
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    v.mul_(0.9999)  # an optimizer step between saves
            state["step"] = step
            dist.barrier()
            t0 = time.perf_counter()
            if kind == "local":
                handle = local.save(step, state)
            else:
                ck = durable if kind == "durable" else control
                handle = ck.save(step, state, block=False)
            stall = time.perf_counter() - t0
            handle.wait()
            rows.append(
                {"kind": kind, "round": i, "stall_s": stall, "total_s": time.perf_counter() - t0}
            )
            dist.barrier()
    local.close()
    durable.close()
    control.close()
    gathered = [None] * world
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(gathered, f)
    dist.barrier()
    dist.destroy_process_group()


def summarize(per_rank: list[list[dict]]) -> dict:
    """The gang's stall and total per save (slowest rank), medians, ratios per round."""
    gang: dict[tuple, dict] = {}
    for rows in per_rank:
        for r in rows:
            g = gang.setdefault((r["kind"], r["round"]), {"stall_s": 0.0, "total_s": 0.0})
            g["stall_s"] = max(g["stall_s"], r["stall_s"])
            g["total_s"] = max(g["total_s"], r["total_s"])
    rounds = sorted({i for _, i in gang})
    out: dict = {}
    for kind in KINDS:
        for key in ("stall_s", "total_s"):
            out[f"{kind}_{key}"] = statistics.median(gang[(kind, i)][key] for i in rounds)
    for kind in ("local", "control"):
        for key in ("stall", "total"):
            out[f"{kind}_{key}_ratio"] = statistics.median(
                gang[(kind, i)][f"{key}_s"] / gang[("durable", i)][f"{key}_s"] for i in rounds
            )
    out["rounds"] = len(rounds)
    out["per_round"] = [
        [round(gang[(kind, i)]["stall_s"], 4) for kind in KINDS] for i in rounds
    ]  # [local, durable, control] stall of each round
    return out


def section(args, med: dict, host: dict) -> str:
    rows = [
        ("local tier", "local"),
        ("durable async", "durable"),
        ("durable async, a 2nd root (control)", "control"),
    ]
    table = "".join(
        f"| {name} | {med[f'{k}_stall_s']:.4f} | "
        f"{med.get(f'{k}_stall_ratio', 1.0):.2f} | {med[f'{k}_total_s']:.2f} | "
        f"{med.get(f'{k}_total_ratio', 1.0):.2f} |\n"
        for name, k in rows
    )
    rounds = ", ".join("/".join(f"{x:.3f}" for x in r) for r in med["per_round"])
    return (
        "## Local tier: stall\n\n"
        f"`benchmarks/tier_stall.py` (issue 35): {args.ranks} gloo ranks on one host, about "
        f"{args.mib} MiB of state (random fp32, each rank its share, plus shared small values); "
        "each round saves it with the local tier (`LocalTier.save`: the async save into each "
        "rank's own root, then in the background the fan-out and the PIECE), with a durable "
        "async save (`Checkpointer.save(block=False)`, a root on the same disk) and, as a "
        "control, with a second durable Checkpointer made last (the same save again: the "
        "noise floor of this host); order rotating, snapshot buffers prepared for all, each "
        "save waited for before the next. The gang's figure is its slowest rank's; medians of "
        f"{med['rounds']} rounds; the ratios are medians of each round's ratio.\n\n"
        "| save | stall s | stall vs durable | save to the end s | vs durable |\n"
        "|---|---|---|---|---|\n"
        f"{table}\n"
        f"Per round (local/durable/control stall s): {rounds}. "
        "The stall is the same host snapshot (the same Stager code) in each; the local save's "
        "background adds the fan-out (a broadcast of the manifest, the shared objects) and its "
        "PIECE. "
        f"Host: {host['cpu']}, {host['cores']} cores, {host['disk']}; load "
        f"{', '.join(f'{x:.1f}' for x in host['loadavg_at_end'])}.\n"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=256, help="size of the gang's state in MiB")
    ap.add_argument("--ranks", type=int, default=2, help="gloo ranks on this host")
    ap.add_argument("--repeats", type=int, default=7, help="rounds (medians are printed)")
    ap.add_argument("--dir", default="/var/tmp", help="where the local and durable roots go")
    ap.add_argument("--docs", action="store_true", help="write the docs/benchmarks.md section")
    args = ap.parse_args(argv)
    import torch.multiprocessing as mp

    from benchmarks import bench_host, docs_section
    from tests.steps.distworkers import free_port

    base = Path(tempfile.mkdtemp(prefix="ckptflow-tier-stall-", dir=args.dir))
    try:
        out = str(base / "rows.json")
        cfg = {
            "mib": args.mib,
            "repeats": args.repeats,
            "local": str(base / "local"),
            "durable": str(base / "durable"),
        }
        ctx = mp.get_context("spawn")
        port = free_port()
        procs = [
            ctx.Process(target=_worker, args=(r, args.ranks, port, cfg, out))
            for r in range(args.ranks)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode != 0 for p in procs):
            print(f"a rank failed: exit codes {[p.exitcode for p in procs]}", file=sys.stderr)
            return 1
        with open(out) as f:
            med = summarize(json.load(f))
        host = bench_host.machine(args.dir)
        print(json.dumps({"mib": args.mib, "ranks": args.ranks, "median": med}, indent=1))
        print(
            f"stall: local {med['local_stall_s']:.4f}s vs durable async "
            f"{med['durable_stall_s']:.4f}s (ratio {med['local_stall_ratio']:.2f}; control "
            f"{med['control_stall_ratio']:.2f}); to the end: "
            f"local {med['local_total_s']:.2f}s vs durable {med['durable_total_s']:.2f}s"
        )
        if args.docs:
            docs_section.write_section("tier_stall", section(args, med, host))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())

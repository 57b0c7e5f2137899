"""The stall of async saves: the first one and a steady one, ckptflow against DCP's async_save.

A script, not a test: `python benchmarks/async_stall.py [--gib 1] [--repeats 5]`. Each method
runs in its own fresh process (a first save is only first once per process), interleaved with
the others in every repeat; medians over the repeats, and per repeat the ratio to DCP with a
reused DefaultStager of the same repeat. Every process saves the same LLM-shaped fp32 state
(benchmarks/llm_state.py) twice, asynchronously, with one AdamW-like in-place update
in between, on local disk:

- ckptflow: `save(block=False)` twice, no preparation (the first stall faults in fresh pages);
- ckptflow-prepared: `prepare(state)` first (what the training loop does after its first step;
  the background allocation time is reported as prepare_s), then the two saves;
- ckptflow-prepared-1copy: as ckptflow-prepared with one copy thread (the snapshot copy was
  single-threaded before it was split over the Stager's copy threads);
- dcp-stager: `dcp.async_save` with one DefaultStager (shared memory, no CUDA here) reused;
- dcp-default: `dcp.async_save` without a stager (a fresh host copy per save).

No GPU in this session: pinned memory and non-blocking copies (the CUDA paths of both
stagers) are not exercised.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

METHODS = ("ckptflow", "ckptflow-prepared", "ckptflow-prepared-1copy", "dcp-stager", "dcp-default")
HERE = os.path.dirname(os.path.abspath(__file__))


def _update(sd: dict) -> None:
    """One AdamW-like in-place update of every tensor (training between the two saves)."""
    for v in sd.values():
        if v.is_floating_point() and v.numel() > 1:
            v.mul_(0.9999)


def _ckptflow(sd: dict, root: str, prepared: bool, one_copy_thread: bool = False) -> dict:
    from ckptflow.steps.checkpoint import Checkpointer

    ck = Checkpointer(root)
    if one_copy_thread:
        ck._stager.copy_threads = 1
    out = {"copy_threads": ck._stager.copy_threads}
    if prepared:
        ck.prepare(sd)
        ck._stager.wait_prepared()  # as the training's next steps run meanwhile
        out["prepare_s"] = ck._stager.prepared_s
    for i, name in ((1, "first"), (2, "steady")):
        t0 = time.perf_counter()
        handle = ck.save(i, sd, block=False)
        out[f"{name}_stall_s"] = time.perf_counter() - t0
        handle.wait()
        out[f"{name}_total_s"] = time.perf_counter() - t0
        _update(sd)
    ck.close()
    return out


def _dcp(sd: dict, root: str, reuse: bool) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    stager = None
    if reuse:  # no CUDA: no pinned memory, no async staging, no non-blocking copies
        stager = DefaultStager(StagingOptions(False, True, False, False))
    out = {}
    for i, name in ((1, "first"), (2, "steady")):
        writer = FileSystemWriter(os.path.join(root, str(i)), thread_count=2)
        t0 = time.perf_counter()
        kw = {"async_stager": stager} if stager is not None else {}
        res = dcp.async_save(sd, storage_writer=writer, no_dist=True, **kw)
        out[f"{name}_stall_s"] = time.perf_counter() - t0
        fut = getattr(res, "upload_completion", res)
        fut.result()
        out[f"{name}_total_s"] = time.perf_counter() - t0
        _update(sd)
    if stager is not None:
        stager.close()
    return out


def child(method: str, state: str, root: str) -> dict:
    import torch
    from safetensors.torch import load_file

    torch.set_num_threads(1)  # 2 cores shared by many: intra-op threads only contend
    sd = {k: v.clone() for k, v in load_file(state).items()}  # private, resident memory
    if method.startswith("ckptflow"):
        return _ckptflow(sd, root, "prepared" in method, method.endswith("-1copy"))
    return _dcp(sd, root, method == "dcp-stager")


def run_child(method: str, state: str, work: str) -> dict:
    root = os.path.join(work, method)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", method, state, root]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode or not lines:
        raise SystemExit(f"{method} failed:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    return json.loads(lines[-1][7:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="fp32 state size")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print("RESULT " + json.dumps(child(*a.child)), flush=True)
        return 0
    sys.path.insert(0, os.path.dirname(HERE))
    from benchmarks import llm_state

    rows: dict = {m: [] for m in METHODS}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as work:
        state = os.path.join(work, "state.safetensors")
        llm_state.make_state(int(a.gib * (1 << 30)), state)
        for r in range(a.repeats):
            for m in METHODS[r % len(METHODS) :] + METHODS[: r % len(METHODS)]:
                rows[m].append(run_child(m, state, work))
            print(f"repeat {r + 1}: " + json.dumps({m: rows[m][-1] for m in METHODS}), flush=True)
    print(f"\nasync save stall, {a.gib:g} GiB fp32 state, medians of {a.repeats} (seconds)")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'method':20} {'first':>7} {'steady':>7} {'1st total':>9} {'prepare':>8}")
    for m in METHODS:
        med = {k: statistics.median(x[k] for x in rows[m]) for k in rows[m][0]}
        prep = f"{med['prepare_s']:8.2f}" if "prepare_s" in med else f"{'':8}"
        print(
            f"{m:20} {med['first_stall_s']:7.3f} {med['steady_stall_s']:7.3f} "
            f"{med['first_total_s']:9.2f} {prep}"
        )
    base = rows["dcp-stager"]
    for m in ("ckptflow", "ckptflow-prepared", "ckptflow-prepared-1copy"):
        for k in ("first_stall_s", "steady_stall_s"):
            ratio = statistics.median(x[k] / b[k] for x, b in zip(rows[m], base, strict=True))
            print(f"{m} {k[:-8]} stall / dcp-stager (paired median): {ratio:.2f}")
    one = rows["ckptflow-prepared-1copy"]
    for k in ("first_stall_s", "steady_stall_s"):
        pairs = zip(rows["ckptflow-prepared"], one, strict=True)
        ratio = statistics.median(x[k] / b[k] for x, b in pairs)
        print(f"ckptflow-prepared {k[:-8]} stall / one copy thread (paired median): {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Cooperative load (2 gloo ranks on one host) against a plain single-rank load of the same step.

A script, not a test: `python benchmarks/coop_load.py [--gib 1] [--repeats 5]`. The LLM-shaped
fp32 state of benchmarks/checkpoint_methods.py is saved once with ckptflow; then each repeat
runs, interleaved, a plain load in one fresh process and a cooperative load of the whole
(replicated) state in two fresh processes, warm page cache for both. Reported per method:
medians of the load wall time (the slower rank), the paired ratio coop / plain, the bytes each
rank read from storage over the stored bytes, and peak RSS over the state size (VmHWM, which
includes the destination state itself and the interpreter with torch) and the extra peak over
what the process held before the load (the destination allocated). Every load is checked
bitwise against the saved state (after the timing).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GIB = float(1 << 30)


def _rss(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def child(spec: dict) -> dict:
    """One rank (or the only process) loading the whole state."""
    import torch
    import torch.distributed as dist

    sys.path.insert(0, os.path.dirname(HERE))
    from ckptflow.steps.checkpoint import Checkpointer

    from benchmarks import checkpoint_methods as cm

    torch.set_num_threads(1)
    world = spec["world"]
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(spec["port"]))
        dist.init_process_group("gloo", rank=spec["rank"], world_size=world)
    expect = cm.read_json(spec["expect"])
    sd = cm.template(expect)
    for v in sd.values():  # the destination is resident before the load (as a model is)
        v.reshape(-1).view(torch.uint8).numpy()[::4096] = 1
    ck = Checkpointer(spec["root"])
    if world > 1:
        dist.barrier()
    before = _rss("VmRSS")
    t0 = time.perf_counter()
    ck.load(sd, 1)
    secs = time.perf_counter() - t0
    peak = _rss("VmHWM")
    if cm.digests(sd) != expect["digests"]:
        raise SystemExit(f"rank {spec['rank']}: the loaded state differs from the saved one")
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    ck.close()
    return {
        "load_s": secs,
        "bytes_read": ck.last_load.bytes_read,
        "bytes_received": ck.last_load.bytes_received,
        "rss_peak": peak,
        "rss_before": before,
        "held": ck.last_load.chunks_held_peak,
    }


def spawn(spec: dict) -> subprocess.Popen:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def collect(procs: list) -> list[dict]:
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=900)
        lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
        if p.returncode or not lines:
            raise SystemExit(f"a load failed:\n{stdout[-2000:]}\n{stderr[-4000:]}")
        out.append(json.loads(lines[-1][7:]))
    return out


def run(base: dict, world: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = collect([spawn(base | {"rank": r, "world": world, "port": port}) for r in range(world)])
    state, stored = base["state_bytes"], base["stored_bytes"]
    return {
        "load_s": max(r["load_s"] for r in ranks),
        "read": max(r["bytes_read"] for r in ranks) / stored,
        "rss_peak": max(r["rss_peak"] for r in ranks) / state,
        "rss_extra": max(r["rss_peak"] - r["rss_before"] for r in ranks) / state,
        "held": max(r["held"] for r in ranks),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="fp32 state size")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print("RESULT " + json.dumps(child(json.loads(a.child))), flush=True)
        return 0
    sys.path.insert(0, os.path.dirname(HERE))
    from ckptflow.steps.checkpoint import Checkpointer
    from safetensors.torch import load_file

    from benchmarks import checkpoint_methods as cm

    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as work:
        path = os.path.join(work, "state.safetensors")
        cm.make_state(int(a.gib * GIB), path)
        sd = load_file(path)
        root = os.path.join(work, "ckpt")
        ck = Checkpointer(root)
        ck.save(1, sd)
        ck.close()
        with open(os.path.join(work, "expect.json"), "w") as f:
            json.dump(cm.expectation(sd), f)
        base = {
            "root": root,
            "expect": os.path.join(work, "expect.json"),
            "state_bytes": cm.nbytes(sd),
            "stored_bytes": ck.manifest(1)["stats"]["stored_bytes"],
        }
        del sd
        rows: dict = {"plain": [], "coop2": []}
        for r in range(a.repeats):
            order = [("plain", 1), ("coop2", 2)][:: 1 if r % 2 == 0 else -1]
            for name, world in order:
                rows[name].append(run(base, world))
            print(f"repeat {r + 1}: " + json.dumps({m: rows[m][-1] for m in rows}), flush=True)
    print(f"\nload of a {a.gib:g} GiB fp32 state, warm cache, medians of {a.repeats}")
    print(f"{'method':8} {'load s':>7} {'read/stored':>11} {'peak/state':>10} {'extra/state':>11}")
    for name, rs in rows.items():
        med = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
        print(
            f"{name:8} {med['load_s']:7.2f} {med['read']:11.3f} {med['rss_peak']:10.2f} "
            f"{med['rss_extra']:11.2f}   (temporary chunks held at most: {med['held']:.0f})"
        )
    pairs = [c["load_s"] / p["load_s"] for c, p in zip(rows["coop2"], rows["plain"], strict=True)]
    print(f"coop2 / plain load time (paired median): {statistics.median(pairs):.2f}")
    print("pairs:", " ".join(f"{x:.2f}" for x in pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main())

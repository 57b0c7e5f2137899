"""Cooperative load (2 gloo ranks on one host) against a plain single-rank load of the same step.

A script, not a test: `python benchmarks/coop_load.py [--gib 1] [--repeats 5]`. The LLM-shaped
fp32 state of benchmarks/llm_state.py is saved once with ckptflow; then each repeat
runs, interleaved in a rotating order, each method in fresh processes, warm page cache for all:
- plain: one process loads the whole state (the target's reference);
- plain2: two ranks each load the whole state without cooperating, at the same time (what a
  cooperative load replaces on a host; on a machine with few cores they share the cores);
- coop2: two ranks load it cooperatively (same host: parts copied out of the owner's memory);
- coop2-bcast: the same with every part broadcast over gloo (what ranks on different hosts do);
- plain-1core, coop2-1core: plain and coop2 with each process pinned to a core of its own and
  one thread (the CPU each rank of a real host has to itself; unpinned, two ranks share the
  two cores one plain load has alone here, so coop2 / plain mostly measures that sharing).
Reported per method: medians of the load wall time (the slower rank), paired ratios against
plain and plain2, CPU-seconds of all ranks, bytes each rank read from storage over the stored
bytes, how many bytes came from a peer's memory, and the load's peak RSS over the state size:
the peak (VmHWM, reset just before the load) minus what the process held before its
destination was allocated, so it counts the destination the load fills plus everything the
load itself holds (the target: at most 1.2x), and the extra above the resident destination.
The load average is printed before and after. Every load is checked bitwise against the saved
state (after the timing).
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

    from benchmarks import llm_state, probes

    torch.set_num_threads(1)
    if spec.get("pinned"):  # this rank alone on one core, as ranks of a host have their own
        os.sched_setaffinity(0, {spec["rank"] % os.cpu_count()})
    world = spec["world"]
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(spec["port"]))
        dist.init_process_group("gloo", rank=spec["rank"], world_size=world)
    expect = probes.read_json(spec["expect"])
    ck = Checkpointer(
        spec["root"], cooperative=spec.get("cooperative", True), threads=spec.get("threads", 4)
    )
    base = _rss("VmRSS")
    sd = llm_state.template(expect)
    for v in sd.values():  # the destination is resident before the load (as a model is)
        v.reshape(-1).view(torch.uint8).numpy()[::4096] = 1
    if world > 1:
        dist.barrier()
    probes.reset_peak_rss()  # VmHWM from here on is the load's peak
    before = _rss("VmRSS")
    t0, c0 = time.perf_counter(), time.process_time()
    ck.load(sd, 1)
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = _rss("VmHWM")
    if llm_state.digests(sd) != expect["digests"]:
        raise SystemExit(f"rank {spec['rank']}: the loaded state differs from the saved one")
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    ck.close()
    return {
        "load_s": secs,
        "cpu_s": cpu,
        "bytes_read": ck.last_load.bytes_read,
        "bytes_received": ck.last_load.bytes_received,
        "bytes_local": ck.last_load.bytes_received_local,
        "rss_peak": peak,
        "rss_before": before,
        "rss_base": base,
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


# name -> (ranks, Checkpointer's `cooperative`, each rank pinned to its own core)
METHODS = {
    "plain": (1, True, False),
    "plain2": (2, False, False),
    "coop2": (2, True, False),
    "coop2-bcast": (2, "broadcast", False),
    # Each process on one core of its own with one thread: the CPU budget each rank of a real
    # host has, where the unpinned ranks above share this machine's two cores.
    "plain-1core": (1, True, True),
    "coop2-1core": (2, True, True),
}


def run(base: dict, method: str) -> dict:
    world, cooperative, pinned = METHODS[method]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = base | {"world": world, "port": port, "cooperative": cooperative}
    if pinned:
        spec |= {"pinned": True, "threads": 1}
    ranks = collect([spawn(spec | {"rank": r}) for r in range(world)])
    state, stored = base["state_bytes"], base["stored_bytes"]
    return {
        "load_s": max(r["load_s"] for r in ranks),
        "cpu_s": sum(r["cpu_s"] for r in ranks),
        "read": max(r["bytes_read"] for r in ranks) / stored,
        "local": min(r["bytes_local"] for r in ranks) / state,
        "rss_load": max(r["rss_peak"] - r["rss_base"] for r in ranks) / state,
        "rss_extra": max(r["rss_peak"] - r["rss_before"] for r in ranks) / state,
        "held": max(r["held"] for r in ranks),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="fp32 state size")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print("RESULT " + json.dumps(child(json.loads(a.child))), flush=True)
        return 0
    sys.path.insert(0, os.path.dirname(HERE))
    from ckptflow.steps.checkpoint import Checkpointer
    from safetensors.torch import load_file

    from benchmarks import llm_state

    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as work:
        path = os.path.join(work, "state.safetensors")
        llm_state.make_state(int(a.gib * GIB), path)
        sd = load_file(path)
        root = os.path.join(work, "ckpt")
        ck = Checkpointer(root)
        ck.save(1, sd)
        ck.close()
        with open(os.path.join(work, "expect.json"), "w") as f:
            json.dump(llm_state.expectation(sd), f)
        base = {
            "root": root,
            "expect": os.path.join(work, "expect.json"),
            "state_bytes": llm_state.nbytes(sd),
            "stored_bytes": ck.manifest(1)["stats"]["stored_bytes"],
        }
        del sd
        rows: dict = {m: [] for m in a.methods}
        load0 = os.getloadavg()
        for r in range(a.repeats):
            order = a.methods[r % len(a.methods) :] + a.methods[: r % len(a.methods)]
            for name in order:
                rows[name].append(run(base, name))
            print(f"repeat {r + 1}: " + json.dumps({m: rows[m][-1] for m in rows}), flush=True)
        load1 = os.getloadavg()
    report(a, rows, load0, load1)
    return 0


def report(a, rows: dict, load0, load1) -> None:
    print(f"\nload of a {a.gib:g} GiB fp32 state, warm cache, medians of {a.repeats}")
    before, after = (" ".join(f"{x:.2f}" for x in la) for la in (load0, load1))
    print(f"load average (1/5/15 min) before: {before}, after: {after}")
    print(
        f"{'method':12} {'load s':>7} {'CPU s':>7} {'read/stored':>11} {'local/state':>11} "
        f"{'peak/state':>10} {'extra/state':>11}"
    )
    for name, rs in rows.items():
        med = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
        print(
            f"{name:12} {med['load_s']:7.3f} {med['cpu_s']:7.3f} {med['read']:11.3f} "
            f"{med['local']:11.3f} {med['rss_load']:10.3f} {med['rss_extra']:11.3f}"
            f"   (temporary chunks held at most: {med['held']:.0f})"
        )
    pinned = {m for m in rows if METHODS[m][2]}
    for ref in ("plain", "plain2", "plain-1core"):
        same = [m for m in rows if m.startswith("coop") and (m in pinned) == (ref in pinned)]
        for name in [m for m in same if ref in rows]:
            pairs = [c["load_s"] / p["load_s"] for c, p in zip(rows[name], rows[ref], strict=True)]
            print(
                f"{name} / {ref} load time (paired median): {statistics.median(pairs):.2f}"
                "   pairs: " + " ".join(f"{x:.2f}" for x in pairs)
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

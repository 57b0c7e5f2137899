"""Interop round trips, bitwise, with sizes and times next to each format's own save and load.

    .venv/bin/python benchmarks/interop.py --mib 256 [--shard-mib 32] [--dir /scratch]

One LLM-shaped state (fp32 matrices and bf16 copies, an int64 buffer, AdamW-like moments and a
few plain values) goes through three round trips on local disk:

- DCP -> ckptflow -> DCP: stock `dcp.save`, `ckpt import`, `ckpt export --format dcp`, stock
  `dcp.load` of the export;
- torch.save -> ckptflow: `torch.save`, `ckpt import`, `Checkpointer.load`;
- HF sharded -> ckptflow -> HF sharded: safetensors shards + index, `ckpt import`,
  `ckpt export --format hf`, `safetensors` load of the export.

Every arrow is checked bitwise against the original state. The export runs in a fresh process
whose peak RSS growth (over the process after its imports) is printed next to the model size
and the shard size: streaming means the
export's memory follows the shard, not the model. Page cache is not dropped (times are warm).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from ckptflow.steps.checkpoint import Checkpointer  # noqa: E402
from ckptflow.steps.checkpoint.interop import export_checkpoint, import_checkpoint  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

MIB = 1 << 20


def make_state(mib: int) -> dict:
    """~`mib` MiB: layers of fp32 weights (with bf16 twins), moments, ids and values."""
    g = torch.Generator().manual_seed(0)
    n_layers, width = 8, 256
    rows = max(1, mib * MIB // (n_layers * width * 4 * 3 + n_layers * width * 2))
    model, optim = {}, {}
    for i in range(n_layers):
        w = torch.randn(rows, width, generator=g) * 0.02
        model[f"blocks.{i}.weight"] = w
        model[f"blocks.{i}.weight_bf16"] = w.bfloat16()
        optim[f"blocks.{i}.exp_avg"] = torch.randn(rows, width, generator=g) * 1e-3
        optim[f"blocks.{i}.exp_avg_sq"] = torch.rand(rows, width, generator=g) * 1e-6
    model["ids"] = torch.arange(1024, dtype=torch.int64)
    return {"model": model, "optim": optim, "step": 1000, "sched": {"lr": 3e-4, "warm": 100}}


def tensors_of(state: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in state.items():
        if isinstance(v, dict):
            out.update(tensors_of(v, f"{prefix}{k}."))
        elif isinstance(v, torch.Tensor):
            out[f"{prefix}{k}"] = v
    return out


def same(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in b)


def du(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def timed(fn, *a, **kw):
    t0 = time.perf_counter()
    out = fn(*a, **kw)
    return out, time.perf_counter() - t0


def zeros(state):
    if isinstance(state, torch.Tensor):
        return torch.zeros_like(state)
    if isinstance(state, dict):
        return {k: zeros(v) for k, v in state.items()}
    return None


def ck_load(root: str, state: dict) -> tuple[dict, float]:
    target = zeros(state)
    with Checkpointer(root) as ck:
        _, secs = timed(ck.load, target)
    return target, secs


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _export_child(q, root, to, fmt, shard):
    # The peak-RSS counter survives fork + exec (it would report the parent's peak): reset it
    # (Linux: "5" > clear_refs), then read the export's own high-water mark.
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = _status_kib("VmRSS")
    except OSError:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rep, secs = timed(export_checkpoint, root, to, fmt=fmt, shard_bytes=shard)
    try:
        peak = _status_kib("VmHWM")
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    q.put(
        {
            "seconds": secs,
            "files": len(rep.files),
            "peak_rss_mib": peak / 1024,
            "rss_growth_mib": (peak - base) / 1024,
        }
    )


def export_in_child(root, to, fmt, shard) -> dict:
    """Export in a fresh process, so its peak RSS is the export's own."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_export_child, args=(q, root, to, fmt, shard))
    p.start()
    res = q.get(timeout=1800)
    p.join()
    return res


def row(name, size, secs, ok=None, extra=""):
    mark = "" if ok is None else ("  bitwise OK" if ok else "  BITWISE MISMATCH")
    mbs = size / MIB / secs if secs else 0
    print(f"  {name:<40} {size / MIB:9.1f} MiB {secs:8.2f} s {mbs:8.0f} MiB/s{mark}{extra}")


def dcp_trip(state, tmp, shard, results):
    print("DCP -> ckptflow -> DCP")
    src, root, out = f"{tmp}/dcp", f"{tmp}/ck-dcp", f"{tmp}/dcp-out"
    _, t = timed(dcp.save, state, checkpoint_id=src, no_dist=True)
    row("dcp.save (stock)", du(src), t)
    target = zeros(state)
    _, t = timed(dcp.load, target, checkpoint_id=src, no_dist=True)
    row("dcp.load (stock)", du(src), t, same(tensors_of(target), tensors_of(state)))
    rep, t = timed(import_checkpoint, src, root)
    row("ckpt import (dcp)", du(root), t, extra=f"  stored {du(root) / du(src):.2f}x of dcp")
    got, t = ck_load(root, state)
    row("Checkpointer.load", du(root), t, same(tensors_of(got), tensors_of(state)))
    ex = export_in_child(root, out, "dcp", shard)
    row(
        "ckpt export --format dcp",
        du(out),
        ex["seconds"],
        extra=f"  {ex['files']} files, peak RSS +{ex['rss_growth_mib']:.0f} MiB",
    )
    target = zeros(state)
    _, t = timed(dcp.load, target, checkpoint_id=out, no_dist=True)
    ok = same(tensors_of(target), tensors_of(state)) and target["step"] == state["step"]
    row("dcp.load of the export (stock)", du(out), t, ok)
    results["dcp"] = {"export": ex, "bitwise": ok}


def torch_trip(state, tmp, results):
    print("torch.save -> ckptflow")
    src, root = f"{tmp}/state.pt", f"{tmp}/ck-torch"
    _, t = timed(torch.save, state, src)
    row("torch.save (stock)", du(src), t)
    got, t = timed(torch.load, src, weights_only=True)
    row("torch.load weights_only (stock)", du(src), t, same(tensors_of(got), tensors_of(state)))
    _, t = timed(import_checkpoint, src, root)
    row("ckpt import (torch)", du(root), t)
    got, t = ck_load(root, state)
    ok = same(tensors_of(got), tensors_of(state)) and got["sched"] == state["sched"]
    row("Checkpointer.load", du(root), t, ok)
    results["torch"] = {"bitwise": ok}


def hf_save_sharded(tensors: dict, folder: str, shard: int) -> None:
    os.makedirs(folder, exist_ok=True)
    groups, cur, size = [], [], 0
    for k in sorted(tensors):
        n = tensors[k].numel() * tensors[k].element_size()
        if cur and size + n > shard:
            groups.append(cur)
            cur, size = [], 0
        cur.append(k)
        size += n
    groups.append(cur)
    wmap = {}
    for i, g in enumerate(groups, 1):
        rel = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        save_file({k: tensors[k] for k in g}, f"{folder}/{rel}")
        wmap.update(dict.fromkeys(g, rel))
    with open(f"{folder}/model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {}, "weight_map": wmap}, f)


def hf_load(folder: str) -> dict:
    with open(f"{folder}/model.safetensors.index.json") as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for rel in files:
        out.update(load_file(f"{folder}/{rel}"))
    return out


def hf_trip(state, tmp, shard, results):
    print("HF sharded -> ckptflow -> HF sharded")
    tensors = dict(state["model"])
    src, root, out = f"{tmp}/hf", f"{tmp}/ck-hf", f"{tmp}/hf-out"
    _, t = timed(hf_save_sharded, tensors, src, shard)
    row("safetensors save, sharded (stock)", du(src), t)
    got, t = timed(hf_load, src)
    row("safetensors load (stock)", du(src), t, same(got, tensors))
    _, t = timed(import_checkpoint, src, root)
    row("ckpt import (hf)", du(root), t)
    got, t = ck_load(root, tensors)
    row("Checkpointer.load", du(root), t, same(got, tensors))
    ex = export_in_child(root, out, "hf", shard)
    row(
        "ckpt export --format hf",
        du(out),
        ex["seconds"],
        extra=f"  {ex['files']} shards, peak RSS +{ex['rss_growth_mib']:.0f} MiB",
    )
    got, t = timed(hf_load, out)
    ok = same(got, tensors)
    row("safetensors load of the export (stock)", du(out), t, ok)
    results["hf"] = {"export": ex, "bitwise": ok}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mib", type=int, default=256, help="size of the state")
    p.add_argument("--shard-mib", type=int, default=32, help="shard size of the exports")
    p.add_argument("--dir", default=None, help="scratch folder (default: a temporary one)")
    args = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="ckptflow-interop-", dir=args.dir)
    try:
        state = make_state(args.mib)
        size = sum(t.numel() * t.element_size() for t in tensors_of(state).values())
        print(
            f"state: {size / MIB:.1f} MiB in {len(tensors_of(state))} tensors; "
            f"export shards of {args.shard_mib} MiB; scratch {tmp}"
        )
        shard = args.shard_mib * MIB
        results: dict = {}
        dcp_trip(state, tmp, shard, results)
        torch_trip(state, tmp, results)
        hf_trip(state, tmp, shard, results)
        ok = all(r["bitwise"] for r in results.values())
        print("all round trips bitwise: " + ("yes" if ok else "NO"))
        return 0 if ok else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())

"""Checkpoint benchmark: ckptflow against torch.save, safetensors and DCP, in one run.

    .venv/bin/python benchmarks/checkpoint.py --size-gib 1 --out-dir benchmarks/results --write-docs
    .venv/bin/python benchmarks/checkpoint.py --quick            # 64 MiB state, a smoke run

Every method saves and loads the same LLM-shaped state (GPT-like fp32 weights plus AdamW
exp_avg/exp_avg_sq made by real AdamW steps; and the same state cast to bf16) on local disk (a
scratch folder on the same disk) and on an in-process S3 server (moto). Each save and each load
runs in its own process (benchmarks/checkpoint_methods.py), so its peak RSS is its own. Local
loads are cold: the page cache is dropped before every load (root only; the output says whether
that worked). Every load touches every byte (an xxh3 of every tensor, timed for every method
alike) and is checked bitwise against the saved state. The raw sequential write/read bandwidth
of the same disk (dd-like, 8 MiB blocks, fsync) is measured in the same run as the ceiling.

Writes results.json and results.md to --out-dir (and docs/benchmarks.md with --write-docs) and
prints the targets of issue 4 with pass/miss.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import checkpoint_methods as cm  # noqa: E402

GIB = float(1 << 30)
METHODS = [
    "raw",
    "torch.save",
    "safetensors",
    "dcp",
    "dcp-zstd",
    "ckptflow-sync",
    "ckptflow-async",
    "ckptflow-nohash",
    "ckptflow-incremental",
    "ckptflow-frozen95",
    "ckptflow-coop2",
]
LOCAL_ONLY = {"ckptflow-nohash"}  # an A/B of CPU cost: the S3 server's noise would hide it
CKPTFLOW_DIRS = {m for m in METHODS if m.startswith("ckptflow")} | {"dcp", "dcp-zstd"}


@dataclass(frozen=True)
class Config:
    """What to measure and where."""

    size_gib: float  # size of the fp32 state (weights + AdamW moments) in GiB
    out_dir: str  # results.json / results.md go here
    scratch: str  # local checkpoints are written below this folder (same disk as measured)
    backends: tuple  # "local", "s3"
    dtypes: tuple  # "fp32", "bf16"
    only: tuple  # methods to run (all when empty)
    threads: int  # ckptflow writer/reader threads and DCP thread_count
    torch_threads: int  # torch intra-op threads in every child (0: torch's default)
    timeout_s: int  # per child process
    write_docs: bool  # also write docs/benchmarks.md
    keep: bool  # keep the scratch folder


def parse(argv=None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-gib", type=float, default=1.0, help="fp32 state size (GiB)")
    p.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    p.add_argument("--scratch", default=None, help="local checkpoint folder (default: out-dir)")
    p.add_argument("--backends", default="local,s3", help="comma list of local,s3")
    p.add_argument("--dtypes", default="fp32,bf16", help="comma list of fp32,bf16")
    p.add_argument("--only", default="", help=f"comma list of methods: {','.join(METHODS)}")
    p.add_argument("--quick", action="store_true", help="a 64 MiB state (smoke run)")
    p.add_argument("--threads", type=int, default=min(8, max(2, os.cpu_count() or 2)))
    p.add_argument("--torch-threads", type=int, default=0, help="0: torch's default")
    p.add_argument("--timeout-s", type=int, default=1800)
    p.add_argument("--write-docs", action="store_true", help="write docs/benchmarks.md")
    p.add_argument("--keep", action="store_true", help="keep the scratch checkpoints")
    a = p.parse_args(argv)
    only = tuple(m for m in a.only.split(",") if m)
    unknown = set(only) - set(METHODS)
    if unknown:
        p.error(f"unknown methods {sorted(unknown)}; choose from {METHODS}")
    return Config(
        size_gib=1 / 16 if a.quick else a.size_gib,
        out_dir=os.path.abspath(a.out_dir),
        scratch=os.path.abspath(a.scratch or a.out_dir),
        backends=tuple(b for b in a.backends.split(",") if b),
        dtypes=tuple(d for d in a.dtypes.split(",") if d),
        only=only,
        threads=a.threads,
        torch_threads=a.torch_threads,
        timeout_s=a.timeout_s,
        write_docs=a.write_docs,
        keep=a.keep,
    )


# -- S3 ----------------------------------------------------------------------------------------
def start_s3() -> tuple[object, str]:
    """moto's ThreadedMotoServer in this process (as tests/conftest.py); children inherit env."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    os.environ.update(
        AWS_ENDPOINT_URL=url,
        AWS_ACCESS_KEY_ID="bench-key-id",
        AWS_SECRET_ACCESS_KEY="bench-secret",
        AWS_DEFAULT_REGION="us-east-1",
    )
    os.environ.pop("AWS_PROFILE", None)
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=url).create_bucket(Bucket=bucket)
    return server, bucket


# -- running children --------------------------------------------------------------------------
def child(spec: dict, timeout_s: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, os.path.join(HERE, "checkpoint_methods.py"), json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def result(proc: subprocess.Popen, timeout_s: int) -> dict:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise RuntimeError(f"timed out after {timeout_s}s") from None
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (err or out).strip().splitlines()[-6:]
    raise RuntimeError(f"exit {proc.returncode}: " + " | ".join(tail))


def run_child(spec: dict, timeout_s: int) -> dict:
    return result(child(spec, timeout_s), timeout_s)


def cleanup(uri: str) -> None:
    for suffix in ("", "-hashed", "-warmup", "-warmup-hashed"):
        cm.remove(uri + suffix)


def measure(cfg: Config, method: str, backend: str, dtype: str, base: str, work: str, raw_bytes):
    """Save then load one method; returns a result row (errors are recorded, not raised)."""
    ext = {"torch.save": ".pt", "safetensors": ".safetensors", "raw": ".bin"}.get(method, "")
    uri = f"{base}/{method}-{dtype}{ext}"
    spec = {
        "phase": "save",
        "method": method,
        "backend": backend,
        "dtype": dtype,
        "path": uri,
        "work": work,
        "expect": os.path.join(work, f"expect-{method}-{dtype}-{backend}.json"),
        "threads": cfg.threads,
        "torch_threads": cfg.torch_threads,
        "raw_bytes": raw_bytes,
    }
    row = {"method": method, "backend": backend, "dtype": dtype}
    t0 = time.perf_counter()
    try:
        saved = run_child(spec, cfg.timeout_s)
        saved["rss_save_peak_gib"] = saved.pop("rss_peak_gib")
        row.update(saved)
        if not saved.get("no_load"):
            spec |= {"phase": "load", "step": saved.get("step")}
            if method == "ckptflow-coop2":
                row.update(coop_load(cfg, spec, saved))
            else:
                loaded = run_child(spec, cfg.timeout_s)
                loaded["rss_load_peak_gib"] = loaded.pop("rss_peak_gib")
                row.update(loaded)
    except Exception as exc:  # one broken method must not lose the rest of the run
        row["error"] = str(exc)[-600:]
    finally:
        cleanup(uri)
    row["wall_s"] = time.perf_counter() - t0
    return derive(row)


def coop_load(cfg: Config, spec: dict, saved: dict) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [child(spec | {"rank": r, "world": 2, "port": port}, cfg.timeout_s) for r in range(2)]
    ranks = [result(p, cfg.timeout_s) for p in procs]
    stored = saved["manifest"]["stored_bytes"]
    return {
        "load_s": max(r["load_s"] for r in ranks),
        "cold": ranks[0]["cold"],
        "rss_load_peak_gib": max(r["rss_peak_gib"] for r in ranks),
        "ranks": ranks,
        "read_fraction": [r["bytes_read"] / stored for r in ranks],
    }


def derive(row: dict) -> dict:
    """GiB/s and stored/raw from the raw measurements."""
    if "error" in row:
        return row
    raw = row["raw_bytes"]
    if row["method"].startswith("ckptflow"):
        row["stored_bytes"] = row["manifest"]["new_bytes"]  # what the measured save wrote
    row["save_gibs"] = raw / GIB / row["save_s"]
    if row.get("load_s"):
        row["load_gibs"] = raw / GIB / row["load_s"]
    if row["method"] != "raw":
        row["stored_raw"] = row["stored_bytes"] / raw
    if row["method"] != "raw":
        row.setdefault("stall_s", row["save_s"])  # a synchronous save stalls for all of it
    return row


def run(cfg: Config) -> dict:
    os.makedirs(cfg.out_dir, exist_ok=True)
    os.makedirs(cfg.scratch, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="ckptbench-", dir=cfg.scratch)
    load_at_start = os.getloadavg()
    total = int(cfg.size_gib * GIB)
    print(f"generating a {total / GIB:.3f} GiB fp32 state (weights + AdamW moments) ...")
    t0 = time.perf_counter()
    meta = cm.make_state(total, os.path.join(scratch, "state.safetensors"))
    with open(os.path.join(scratch, "meta.json"), "w") as f:
        json.dump(meta, f)
    raw_bytes = os.path.getsize(os.path.join(scratch, "state.safetensors"))
    print(f"  {len(meta['names'])} weight tensors, {time.perf_counter() - t0:.1f}s")
    server = bucket = None
    rows = []
    try:
        if "s3" in cfg.backends:
            server, bucket = start_s3()
        for backend in cfg.backends:
            base = os.path.join(scratch, "ckpt") if backend == "local" else f"s3://{bucket}/ckpt"
            if backend == "local":
                os.makedirs(base, exist_ok=True)
            for method in cfg.only or METHODS:
                if backend != "local" and method in LOCAL_ONLY:
                    continue
                for dtype in ("-",) if method == "raw" else cfg.dtypes:
                    print(f"- {method:22s} {backend:5s} {dtype:4s} ", end="", flush=True)
                    row = measure(cfg, method, backend, dtype, base, scratch, raw_bytes)
                    rows.append(row)
                    print(short(row), flush=True)
    finally:
        if server is not None:
            server.stop()
        if not cfg.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    res = {
        "config": cfg.__dict__ | {"state_bytes_fp32": raw_bytes},
        "machine": machine(cfg.scratch) | {"loadavg_at_start": load_at_start},
        "rows": rows,
    }
    res["targets"] = targets(rows)
    return res


def short(row: dict) -> str:
    if "error" in row:
        return "ERROR " + row["error"][-300:]
    load = f" load {row['load_s']:.2f}s" if row.get("load_s") else ""
    return f"save {row['save_s']:.2f}s{load} stored/raw {row.get('stored_raw', 1):.3f}"


# -- targets and report ------------------------------------------------------------------------
def _get(rows, method, backend, dtype="fp32"):
    for r in rows:
        same = r["method"] == method and r["backend"] == backend and "error" not in r
        if same and (method == "raw" or r["dtype"] == dtype):
            return r
    return None


def targets(rows: list[dict]) -> list[dict]:
    """Issue 4's targets as measured ratios: (name, backend, value, limit, pass)."""
    out = []

    def add(name, backend, value, limit, le=True):
        if value is not None:
            ok = value <= limit if le else value >= limit
            out.append(
                {"target": name, "backend": backend, "value": value, "limit": limit, "pass": ok}
            )

    for b in ("local", "s3"):
        dcp_, ck = _get(rows, "dcp", b), _get(rows, "ckptflow-sync", b)
        asy = _get(rows, "ckptflow-async", b)
        if asy and dcp_:
            add("async stall / DCP sync save", b, asy["stall_s"] / dcp_["save_s"], 0.1)
        if ck and dcp_:
            add(
                "ckptflow save GiB/s / DCP save GiB/s",
                b,
                ck["save_gibs"] / dcp_["save_gibs"],
                1.0,
                False,
            )
            if ck.get("load_gibs") and dcp_.get("load_gibs"):
                add(
                    "ckptflow load GiB/s / DCP load GiB/s",
                    b,
                    ck["load_gibs"] / dcp_["load_gibs"],
                    1.5,
                    False,
                )
        for dt, lim in (("fp32", 0.85), ("bf16", 0.70)):
            r = _get(rows, "ckptflow-sync", b, dt)
            if r:
                add(f"stored/raw {dt}", b, r["stored_raw"], lim)
        for m, lim in (("ckptflow-incremental", 0.6), ("ckptflow-frozen95", 0.1)):
            r = _get(rows, m, b)
            if r:
                add(f"{m} new bytes / full", b, r["ratio_vs_full"], lim)
        r = _get(rows, "ckptflow-coop2", b)
        if r:
            add("coop M=2 max rank read / stored", b, max(r["read_fraction"]), 0.55)
        r = _get(rows, "ckptflow-nohash", b)
        if r:
            add(
                "hash share of save (A/B: 1 - nohash/hashed)",
                b,
                1 - r["save_s"] / r["save_s_hashed"],
                0.10,
            )
            add(
                "hash share of save (xxh3 CPU-s / save wall-s)",
                b,
                r["hash_s_total_est"] / r["save_s_hashed"],
                0.10,
            )
    return out


def _f(v, fmt="{:.2f}"):
    return "" if v is None else fmt.format(v)


def notes(r: dict) -> str:
    m = r["method"]
    if "error" in r:
        return "error: " + r["error"][-120:].replace("|", "/")
    if m == "ckptflow-async":
        return f"first save's stall {r['first_stall_s']:.2f}s (fresh buffers); total = until wait()"
    if m in ("ckptflow-incremental", "ckptflow-frozen95"):
        extra = f", {r['changed_fraction']:.1%} changed" if "changed_fraction" in r else ""
        return f"new bytes / full = {r['ratio_vs_full']:.3f}{extra}"
    if m == "ckptflow-coop2":
        return "rank read / stored = " + ", ".join(f"{x:.3f}" for x in r["read_fraction"])
    if m == "ckptflow-nohash":
        return (
            f"hashed save {r['save_s_hashed']:.2f}s; xxh3 over raw+stored "
            f"{r['hash_s_total_est']:.2f}s (1 thread)"
        )
    if m == "raw":
        return "dd-like ceiling" + ("" if r["backend"] == "local" else " (one object)")
    return ""


def markdown(res: dict) -> str:
    head = (
        "| method | backend | dtype | save s | stall s | load s | save GiB/s | load GiB/s "
        "| stored/raw | peak RSS save/load GiB | notes |\n|" + " --- |" * 11 + "\n"
    )
    lines = []
    for r in res["rows"]:
        rss = f"{_f(r.get('rss_save_peak_gib'))}/{_f(r.get('rss_load_peak_gib'))}"
        lines.append(
            f"| {r['method']} | {r['backend']} | {r['dtype']} | {_f(r.get('save_s'))} "
            f"| {_f(r.get('stall_s'))} | {_f(r.get('load_s'))} | {_f(r.get('save_gibs'))} "
            f"| {_f(r.get('load_gibs'))} | {_f(r.get('stored_raw'), '{:.3f}')} | {rss} | {notes(r)} |"
        )
    tgt = ["| target | backend | measured | limit | result |", "| --- | --- | --- | --- | --- |"]
    for t in res["targets"]:
        tgt.append(
            f"| {t['target']} | {t['backend']} | {t['value']:.3f} | {t['limit']} "
            f"| {'pass' if t['pass'] else '**miss**'} |"
        )
    return head + "\n".join(lines) + "\n\n" + "\n".join(tgt) + "\n"


def _lines(path: str) -> list[str]:
    with open(path) as f:
        return f.readlines()


def machine(path: str) -> dict:
    """CPU, memory, the disk under `path`, software versions, and how loaded the machine was."""
    import safetensors
    import torch
    import zstandard

    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in _lines("/proc/cpuinfo")
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    mem = next(int(ln.split()[1]) for ln in _lines("/proc/meminfo") if ln.startswith("MemTotal"))
    dev = subprocess.run(
        ["df", "--output=source,fstype,size", path], capture_output=True, text=True
    )
    src = dev.stdout.split("\n")[1].split() if dev.returncode == 0 else ["?"]
    if len(src) == 3:  # df reports 1K blocks
        src[2] = f"{int(src[2]) / (1 << 20):.0f} GiB"
    blk = os.path.basename(src[0])
    rot = f"/sys/block/{blk}/queue/rotational"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem / (1 << 20), 1),
        "disk": " ".join(src),
        "rotational": _lines(rot)[0].strip() if os.path.exists(rot) else "?",
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "zstandard": zstandard.__version__,
        "safetensors": safetensors.__version__,
        "loadavg_at_end": os.getloadavg(),
    }


def _loads(xs) -> str:
    return ", ".join(f"{x:.2f}" for x in xs)


def docs(res: dict, table: str) -> str:
    m, c = res["machine"], res["config"]
    cold = {r.get("cold") for r in res["rows"] if r["backend"] == "local" and "cold" in r}
    return f"""# Checkpoint benchmark

Produced by `.venv/bin/python benchmarks/checkpoint.py --size-gib {c["size_gib"]:g} --write-docs`
(backends {", ".join(c["backends"])}; dtypes {", ".join(c["dtypes"])}); raw results in `results.json`
of its `--out-dir`.

## Machine
- CPU: {m["cpu"]}, {m["cores"]} cores; memory {m["memory_gib"]} GiB; no GPU
- disk: {m["disk"]} (rotational={m["rotational"]}); kernel {m["kernel"]}
- Python {m["python"]}, torch {m["torch"]}, zstandard {m["zstandard"]}, safetensors {m["safetensors"]}
- load average (1/5/15 min) at the start: {_loads(m["loadavg_at_start"])}; at the end: {_loads(m["loadavg_at_end"])}
  (other work on the machine makes the timings noisy; the ratios are measured side by side)

## How it is measured
- State: a GPT-like model ({c["state_bytes_fp32"] / GIB:.2f} GiB fp32: weights N(0, 0.02), small
  biases, LayerNorm gains near 1, plus AdamW exp_avg/exp_avg_sq started at their stationary
  distribution for step 1000 under random gradients with per-row scales, then 5 real AdamW
  steps); `bf16` is the same state cast to bf16. GiB/s = raw state bytes / seconds.
- Each save and each load is its own process (peak RSS = its VmHWM). Local saves include fsync
  (DCP's `sync_files`, ckptflow's one flush per save before its manifest, an explicit fsync for torch.save and
  safetensors). Local loads are {"cold (page cache dropped before each load)" if cold == {True} else "WARM (the page cache could not be dropped)"};
  the S3 server (moto, in this process) keeps objects in memory.
- Every load touches every byte: the timed load includes an xxh3 of every loaded tensor, the
  same for every method, and the result is compared bitwise with the saved state.
- DCP `FileSystemWriter(thread_count={c["threads"]})` (fsspec writer on S3), DCP with
  `_extensions=[ZStandard()]`; ckptflow with `threads={c["threads"]}`, zstd level 1.
- async: the second of two async saves (after an AdamW step; staging buffers reused);
  incremental: a delta (`full_every=11`) after 10 AdamW steps at lr 1e-4; frozen95: a second
  full save after training only the last tensors (~5% of the state); coop2: two gloo ranks
  each load the whole state cooperatively; nohash: the same save with xxh3 replaced by a
  random id (benchmark-only monkeypatch), plus xxh3 timed alone over the same bytes.

## Results

{table}"""


def main(argv=None) -> int:
    cfg = parse(argv)
    res = run(cfg)
    table = markdown(res)
    with open(os.path.join(cfg.out_dir, "results.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    with open(os.path.join(cfg.out_dir, "results.md"), "w") as f:
        f.write(table)
    if cfg.write_docs:
        with open(os.path.join(ROOT, "docs", "benchmarks.md"), "w") as f:
            f.write(docs(res, table))
    print()
    print(table)
    missed = [t for t in res["targets"] if not t["pass"]]
    print(f"{len(res['targets']) - len(missed)} targets met, {len(missed)} missed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a user gets with the defaults, side by side with DCP's defaults in one run (issue 36).

    .venv/bin/python benchmarks/defaults.py [--mib 512] [--repeats 5] [--write-docs]

Every method runs in a fresh process of its own (a first save is only first once per process),
interleaved with the others in every repeat (the order rotates), on the same LLM-shaped fp32
state (benchmarks/llm_state.py) read into the process's own memory. Each process first saves a
small state elsewhere (imports, thread pools and allocators warm, as in a training job whose
first checkpoint comes after its first steps), then:

- ckptflow-sync: a fresh `Checkpointer(root)` with every default (no `prepare`, threads and
  `compress="auto"` as given), one blocking `save`: durable when it returns;
- dcp-sync: `dcp.save` with `FileSystemWriter(path)` as given (thread_count=1, sync_files):
  durable when it returns; dcp-sync-2t: the same with thread_count=2 (the tuned comparator of
  docs/benchmarks.md);
- ckptflow-async: a fresh `Checkpointer(root)`, `save(block=False)` twice with an in-place
  update between, nothing else called (no `prepare`): the stall of the first and second;
- dcp-async: `dcp.async_save` twice as given (its default stager copies into fresh memory:
  a save returns once its copy is made);
- ckptflow-s3 (with --s3): a fresh `Checkpointer` on an S3 API (moto in the parent process),
  one blocking save: its stored/raw (the bytes billed).

Reported: medians, and per repeat the ratio of ckptflow to DCP in the same repeat (paired
median), with the targets: sync save <= 0.8x DCP, first async stall <= DCP's, stored/raw.
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SECTION = "## Defaults against DCP's defaults (issue 36)"
METHODS = ("ckptflow-sync", "dcp-sync", "dcp-sync-2t", "ckptflow-async", "dcp-async")


def _update(sd: dict) -> None:
    """An in-place update of every tensor (training between two saves)."""
    for v in sd.values():
        if v.is_floating_point() and v.numel() > 1:
            v.mul_(0.9999)


def _warm(work: str) -> None:
    """A small save of each kind first: imports, pools and allocators warm."""
    import torch
    import torch.distributed.checkpoint as dcp
    from ckptflow.steps.checkpoint import Checkpointer
    from torch.distributed.checkpoint import FileSystemWriter

    small = {"w": torch.randn(256, 1024), "b": torch.randn(64)}
    with Checkpointer(os.path.join(work, "warm-ck")) as ck:
        ck.save(1, small)
    dcp.save(small, storage_writer=FileSystemWriter(os.path.join(work, "warm-dcp")), no_dist=True)


def _stored(manifest: dict) -> dict:
    st = manifest["stats"]
    return {
        "stored_raw": st["stored_bytes"] / st["raw_bytes"],
        "mode": st.get("compression", {}).get("mode"),
    }


def child(method: str, state: str, root: str) -> dict:
    import torch
    import torch.distributed.checkpoint as dcp
    from ckptflow.steps.checkpoint import Checkpointer
    from safetensors.torch import load_file
    from torch.distributed.checkpoint import FileSystemWriter

    torch.set_num_threads(1)  # 2 cores shared by many: intra-op threads only contend
    sd = {k: v.clone() for k, v in load_file(state).items()}  # private, resident memory
    if not root.startswith("s3://"):
        os.makedirs(root, exist_ok=True)
        _warm(root)
        os.sync()
    target = root if root.startswith("s3://") else os.path.join(root, "target")
    out: dict = {}
    if method in ("ckptflow-sync", "ckptflow-s3"):
        ck = Checkpointer(target)
        t0 = time.perf_counter()
        ck.save(1, sd)
        out["save_s"] = time.perf_counter() - t0
        out |= _stored(ck.manifest(1))
        ck.close()
    elif method.startswith("dcp-sync"):
        kw = {"thread_count": 2} if method.endswith("-2t") else {}
        t0 = time.perf_counter()
        dcp.save(sd, storage_writer=FileSystemWriter(target, **kw), no_dist=True)
        out["save_s"] = time.perf_counter() - t0
    elif method == "ckptflow-async":
        ck = Checkpointer(target)
        for i, name in ((1, "first"), (2, "steady")):
            t0 = time.perf_counter()
            handle = ck.save(i, sd, block=False)
            out[f"{name}_stall_s"] = time.perf_counter() - t0
            handle.wait()
            out[f"{name}_total_s"] = time.perf_counter() - t0
            _update(sd)
        ck.close()
    elif method == "dcp-async":
        for i, name in ((1, "first"), (2, "steady")):
            writer = FileSystemWriter(os.path.join(target, str(i)))
            t0 = time.perf_counter()
            res = dcp.async_save(sd, storage_writer=writer, no_dist=True)
            staged = getattr(res, "staging_completion", None)
            if staged is not None:
                staged.result()  # training may touch its tensors only after this
            out[f"{name}_stall_s"] = time.perf_counter() - t0
            getattr(res, "upload_completion", res).result()
            out[f"{name}_total_s"] = time.perf_counter() - t0
            _update(sd)
    else:
        raise SystemExit(f"unknown method {method}")
    return out


def run_child(method: str, state: str, work: str, root: str | None = None) -> dict:
    root = root or os.path.join(work, method)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", method, state, root]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    finally:
        if not root.startswith("s3://"):
            shutil.rmtree(root, ignore_errors=True)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode or not lines:
        raise SystemExit(f"{method} failed:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    return json.loads(lines[-1][7:]) | {"load": os.getloadavg()[0]}  # (the host is shared)


def _ratios(rows: dict, a: str, b: str, key: str) -> list[float]:
    """Per repeat, a's figure over b's in the same repeat."""
    return [x[key] / y[key] for x, y in zip(rows[a], rows[b], strict=True)]


def _paired(rows: dict, a: str, b: str, key: str) -> float:
    return statistics.median(_ratios(rows, a, b, key))


def report(rows: dict, s3: list, mib: float, repeats: int, argv: str) -> str:
    med = {
        m: {k: statistics.median(x[k] for x in v) for k in v[0] if k != "mode"}
        for m, v in rows.items()
    }
    sync = _paired(rows, "ckptflow-sync", "dcp-sync", "save_s")
    sync2 = _paired(rows, "ckptflow-sync", "dcp-sync-2t", "save_s")
    first = _paired(rows, "ckptflow-async", "dcp-async", "first_stall_s")
    steady = _paired(rows, "ckptflow-async", "dcp-async", "steady_stall_s")
    local = rows["ckptflow-sync"]
    modes = sorted({x["mode"] or "-" for x in local})
    loads = [x["load"] for v in rows.values() for x in v if "load" in x]
    spread = f" (1-minute load {min(loads):.1f}-{max(loads):.1f} over the runs)" if loads else ""
    lines = [
        SECTION,
        "",
        f"Produced by `.venv/bin/python benchmarks/defaults.py {argv}`: {mib:g} MiB fp32 state,",
        f"{repeats} interleaved repeats, each method in a fresh process (benchmarks/defaults.py",
        "says how). ckptflow: a fresh `Checkpointer(root)` with every default, no `prepare`;",
        "DCP: `dcp.save` / `dcp.async_save` with `FileSystemWriter(path)` as given. Local disk;",
        "saves durable when they return. Load average at the end: "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
        + f"{spread}.",
        "",
        "| method | save s | first stall s | steady stall s | first save until done s |",
        "| --- | --- | --- | --- | --- |",
    ]
    for m in METHODS:
        d = med[m]

        def f(k: str, d=d) -> str:
            return f"{d[k]:.3f}" if k in d else ""

        lines.append(
            f"| {m} | {f('save_s')} | {f('first_stall_s')} | {f('steady_stall_s')} | "
            f"{f('first_total_s')} |"
        )
    lines += [
        "",
        "| target (paired median over repeats) | measured | limit | result |",
        "| --- | --- | --- | --- |",
        f"| sync save, fresh Checkpointer / DCP | {sync:.3f} | 0.8 | "
        f"{'pass' if sync <= 0.8 else '**miss**'} |",
        f"| sync save, fresh Checkpointer / DCP thread_count=2 | {sync2:.3f} | | |",
        f"| first async stall, fresh Checkpointer / DCP async_save | {first:.3f} | 1.0 | "
        f"{'pass' if first <= 1.0 else '**miss**'} |",
        f"| second async stall / DCP async_save | {steady:.3f} | | |",
        f"| stored/raw, defaults, local disk (mode {', '.join(modes)}) | "
        f"{statistics.median(x['stored_raw'] for x in local):.3f} | | |",
    ]
    per_repeat = [
        ("sync save / DCP", _ratios(rows, "ckptflow-sync", "dcp-sync", "save_s")),
        ("first stall / DCP", _ratios(rows, "ckptflow-async", "dcp-async", "first_stall_s")),
    ]
    if s3:
        s3modes = ", ".join(sorted({x["mode"] or "-" for x in s3}))
        lines.append(
            f"| stored/raw, defaults, S3 API (moto; mode {s3modes}) | "
            f"{statistics.median(x['stored_raw'] for x in s3):.3f} | | |"
        )
    lines += ["", "Per repeat (in run order):"]
    lines += [f"- {name}: " + " ".join(f"{r:.2f}" for r in rs) for name, rs in per_repeat]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=float, default=512.0, help="fp32 state size")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--s3", action="store_true", help="also save to an S3 API (moto)")
    ap.add_argument("--state", help="the state file to use, made there if absent (--mib)")
    ap.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    sys.path.insert(0, ROOT)
    if a.child:
        print("RESULT " + json.dumps(child(*a.child)), flush=True)
        return 0
    from benchmarks import bench_host, llm_state

    rows: dict = {m: [] for m in METHODS}
    s3: list = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as work:
        state = a.state or os.path.join(work, "state.safetensors")
        if not os.path.exists(state):  # (--state: made once, reused by later runs)
            llm_state.make_state(int(a.mib * (1 << 20)), state)
        server, bucket = bench_host.start_s3() if a.s3 else (None, None)
        try:
            for r in range(a.repeats):
                for m in METHODS[r % len(METHODS) :] + METHODS[: r % len(METHODS)]:
                    rows[m].append(run_child(m, state, work))
                if a.s3:
                    s3.append(run_child("ckptflow-s3", state, work, f"s3://{bucket}/r{r}"))
                print(f"repeat {r + 1}: " + json.dumps({m: rows[m][-1] for m in METHODS}))
        finally:
            if server is not None:
                server.stop()
    args = " ".join(argv if argv is not None else sys.argv[1:])
    args = args.replace(f"--state {a.state}", "--state FILE") if a.state else args
    text = report(rows, s3, a.mib, a.repeats, args)
    print(text)
    if a.write_docs:
        from benchmarks import docs_section

        docs_section.write_section("defaults", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

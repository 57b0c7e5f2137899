"""Reporting of benchmarks/checkpoint.py: medians, paired ratios, issue 19's targets, markdown.

A paired ratio is ckptflow's figure over DCP's (or another anchor's) in the same round, the
median taken over rounds: on a shared machine whose speed drifts 2-3x between minutes, the
ratio of neighbours is what is reproducible, not either figure alone.
"""

from __future__ import annotations

import statistics

GIB = float(1 << 30)
LINK_RATIO = "coop load (2 ranks) / plain load, each rank its own storage link (cold)"
# (name, numerator (method, field), denominator (method, field)) of the paired ratios
RATIOS = [
    ("sync save wall / DCP", ("ckptflow-sync", "save_s"), ("dcp", "save_s")),
    ("sync save CPU / DCP", ("ckptflow-sync", "save_cpu_s"), ("dcp", "save_cpu_s")),
    ("load wall / DCP, warm", ("ckptflow-sync", "load_s_warm"), ("dcp", "load_s_warm")),
    ("load wall / DCP, cold", ("ckptflow-sync", "load_s_cold"), ("dcp", "load_s_cold")),
    ("load CPU / DCP, warm", ("ckptflow-sync", "load_cpu_s_warm"), ("dcp", "load_cpu_s_warm")),
    ("save wall / raw disk write", ("ckptflow-sync", "save_s"), ("raw", "save_s")),
    ("save wall / disk floor (O_DIRECT)", ("ckptflow-sync", "save_s"), ("raw-direct", "save_s")),
    ("disk floor (O_DIRECT) / DCP save", ("raw-direct", "save_s"), ("dcp", "save_s")),
    (
        "async steady stall / DCP async_save stall (reused stager)",
        ("ckptflow-async", "stall_s"),
        ("dcp-async-reused", "stall_s"),
    ),
    (
        "async first stall / DCP async_save first stall (reused stager)",
        ("ckptflow-async", "first_stall_s"),
        ("dcp-async-reused", "first_stall_s"),
    ),
    (
        "coop load (2 ranks) / plain load, warm",
        ("ckptflow-coop2", "load_s_warm"),
        ("ckptflow-sync", "load_s_warm"),
    ),
    (
        LINK_RATIO,
        ("ckptflow-coop2", "load_s_link"),
        ("ckptflow-sync", "load_s_link"),
    ),
]


def _key(method: str, backend: str, dtype: str) -> str:
    return f"{method}|{backend}|{dtype}"


def _numeric(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def summarize(rows: list[dict]) -> dict:
    """{"medians": key -> field -> median, "n": key -> rounds, "ratios": name -> key -> median}."""
    groups: dict = {}
    for r in rows:
        if "error" not in r:
            groups.setdefault(_key(r["method"], r["backend"], r["dtype"]), []).append(r)
    medians, counts = {}, {}
    for key, rs in groups.items():
        fields = {f for r in rs for f, v in r.items() if _numeric(v)} - {"round"}
        medians[key] = {
            f: statistics.median([r[f] for r in rs if _numeric(r.get(f))]) for f in fields
        }
        reads = [max(r["read_fraction"]) for r in rs if r.get("read_fraction")]
        if reads:
            medians[key]["max_read_fraction"] = statistics.median(reads)
        counts[key] = len(rs)
    ratios: dict = {}
    by_round = {
        (r["round"], r["method"], r["backend"], r["dtype"]): r for r in rows if "error" not in r
    }
    for name, (m1, f1), (m2, f2) in RATIOS:
        for backend, dtype in {(r["backend"], r["dtype"]) for r in rows}:
            vals = []
            for rnd in {r["round"] for r in rows}:
                a = by_round.get((rnd, m1, backend, "-" if m1.startswith("raw") else dtype))
                b = by_round.get((rnd, m2, backend, "-" if m2.startswith("raw") else dtype))
                if a and b and _numeric(a.get(f1)) and _numeric(b.get(f2)) and b[f2] > 0:
                    vals.append(a[f1] / b[f2])
            if vals:
                ratios.setdefault(name, {})[_key("", backend, dtype)] = statistics.median(vals)
    return {"medians": medians, "n": counts, "ratios": ratios}


def targets(summary: dict) -> list[dict]:
    """Issue 19's targets, measured: target, backend, dtype, value, limit, pass."""
    med, rat, out = summary["medians"], summary["ratios"], []

    def add(name, backend, dtype, value, limit, note=""):
        if value is not None:
            out.append(
                {
                    "target": name,
                    "backend": backend,
                    "dtype": dtype,
                    "value": value,
                    "limit": limit,
                    "pass": value <= limit,
                    "note": note,
                }
            )

    def m(method, backend, dtype, field):
        return med.get(_key(method, backend, dtype), {}).get(field)

    def r(name, backend, dtype):
        return rat.get(name, {}).get(_key("", backend, dtype))

    for b in sorted({k.split("|")[1] for k in med}):
        floor = r("disk floor (O_DIRECT) / DCP save", b, "fp32")
        add(
            "sync save wall / DCP",
            b,
            "fp32",
            r("sync save wall / DCP", b, "fp32"),
            0.70,
            "" if floor is None else f"the disk's own floor (O_DIRECT, same bytes): {floor:.3f}",
        )
        add("save CPU-s per GiB", b, "fp32", m("ckptflow-sync", b, "fp32", "save_cpu_per_gib"), 1.1)
        add("load wall / DCP, warm", b, "fp32", r("load wall / DCP, warm", b, "fp32"), 1.0)
        add("load wall / DCP, cold", b, "fp32", r("load wall / DCP, cold", b, "fp32"), 0.85)
        for c in ("warm", "cold"):
            v = m("ckptflow-sync", b, "fp32", f"rss_extra_per_gib_{c}")
            add(f"load extra peak RSS per GiB, {c}", b, "fp32", v, 0.2)
        dcp_stall = m("dcp-async-reused", b, "fp32", "stall_s")
        note = "" if dcp_stall is None else f"DCP async_save (reused stager) {dcp_stall:.3f} s"
        add(
            "async stall, first save (s)",
            b,
            "fp32",
            m("ckptflow-async", b, "fp32", "first_stall_s"),
            0.15,
            note,
        )
        add(
            "async stall, steady (s)",
            b,
            "fp32",
            m("ckptflow-async", b, "fp32", "stall_s"),
            0.15,
            note,
        )
        name = "async steady stall / DCP async_save stall (reused stager)"
        add(name, b, "fp32", r(name, b, "fp32"), 1.0)
        add(
            "coop load (2 ranks) / plain load",
            b,
            "fp32",
            r("coop load (2 ranks) / plain load, warm", b, "fp32"),
            1.0,
        )
        add(
            "coop load (2 ranks) / plain load, each rank its own storage link",
            b,
            "fp32",
            r(LINK_RATIO, b, "fp32"),
            1.0,
            "cold; every loading process's disk reads capped alike (storage_link.py)",
        )
        extra = m("ckptflow-coop2", b, "fp32", "rss_extra_per_gib_warm")
        add(
            "coop peak RSS / state (1 + extra per GiB)",
            b,
            "fp32",
            None if extra is None else 1 + extra,
            1.2,
        )
        add(
            "coop read per rank / stored",
            b,
            "fp32",
            m("ckptflow-coop2", b, "fp32", "max_read_fraction"),
            0.55,
        )
        floor = m("ckptflow-incremental", b, "fp32", "entropy_floor")
        note = "" if floor is None else f"order-0 entropy floor {floor:.3f}"
        add(
            "delta new bytes / full, 10 AdamW steps",
            b,
            "fp32",
            m("ckptflow-incremental", b, "fp32", "ratio_vs_full"),
            0.84,
            note,
        )
        for dt, lim in (("fp32", 0.815), ("bf16", 0.629)):
            # the codec's ratio (compress=True; "auto" stores raw where storage outruns it)
            add(f"stored/raw {dt}", b, dt, m("ckptflow-compressed", b, dt, "stored_raw"), lim)
    return out


def _f(v, fmt="{:.2f}"):
    return "" if v is None else fmt.format(v)


def _notes(method: str, x: dict) -> str:
    link = x.get("load_s_link")
    more = _base_notes(method, x)
    if link is None:
        return more
    return (more + "; " if more else "") + f"load over its own storage link {link:.2f} s"


def _base_notes(method: str, x: dict) -> str:
    if method in ("ckptflow-async", "dcp-async", "dcp-async-reused"):
        return f"first save's stall {_f(x.get('first_stall_s'), '{:.3f}')} s; save s = until done"
    if method == "ckptflow-incremental":
        return (
            f"new bytes / full {_f(x.get('ratio_vs_full'), '{:.3f}')}, entropy floor "
            f"{_f(x.get('entropy_floor'), '{:.3f}')}"
        )
    if method == "ckptflow-frozen95":
        return f"new bytes / full {_f(x.get('ratio_vs_full'), '{:.3f}')}"
    if method == "ckptflow-coop2":
        return f"max rank read / stored {_f(x.get('max_read_fraction'), '{:.3f}')}; load = slowest rank"
    if method == "ckptflow-sync" and x.get("compressed_share") is not None:
        return f"`auto` stored {x['compressed_share']:.0%} of the bytes compressed"
    if method == "raw":
        return "dd-like ceiling (8 MiB writes + fsync; reads)"
    if method == "raw-direct":
        return "the disk's floor: O_DIRECT 64 MiB files, all threads, fdatasync each"
    return ""


def markdown(res: dict) -> str:
    s = res["summary"]
    head = (
        "| method | backend | dtype | rounds | save s | save CPU-s/GiB | stall s | load warm s "
        "| load cold s | load CPU-s/GiB warm | load extra RSS/GiB warm/cold | stored/raw | notes |\n|"
        + " --- |"
        * 13
    )
    lines = [head]
    for key, x in s["medians"].items():
        method, backend, dtype = key.split("|")
        rss = f"{_f(x.get('rss_extra_per_gib_warm'))}/{_f(x.get('rss_extra_per_gib_cold'))}"
        lines.append(
            f"| {method} | {backend} | {dtype} | {s['n'][key]} | {_f(x.get('save_s'))} "
            f"| {_f(x.get('save_cpu_per_gib'))} | {_f(x.get('stall_s'), '{:.3f}')} "
            f"| {_f(x.get('load_s_warm'))} | {_f(x.get('load_s_cold'))} "
            f"| {_f(x.get('load_cpu_per_gib_warm'))} | {rss} | {_f(x.get('stored_raw'), '{:.3f}')} "
            f"| {_notes(method, x)} |"
        )
    rat = ["| paired ratio (median over rounds) | backend/dtype | value |", "| --- | --- | --- |"]
    for name, per in s["ratios"].items():
        for key, v in sorted(per.items()):
            rat.append(f"| {name} | {key.strip('|').replace('|', '/')} | {v:.3f} |")
    tgt = [
        "| target | backend | dtype | measured | limit | result | note |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t in res["targets"]:
        tgt.append(
            f"| {t['target']} | {t['backend']} | {t['dtype']} | {t['value']:.3f} | "
            f"{t['limit']} | {'pass' if t['pass'] else '**miss**'} | {t['note']} |"
        )
    errors = [
        f"- {r['method']} {r['backend']} {r['dtype']} round {r['round'] + 1}: {r['error'][-200:]}"
        for r in res["rows"]
        if "error" in r
    ]
    out = "\n".join(lines) + "\n\n" + "\n".join(rat) + "\n\n" + "\n".join(tgt) + "\n"
    return out + ("\nErrors:\n" + "\n".join(errors) + "\n" if errors else "")


def _loads(xs) -> str:
    return ", ".join(f"{x:.2f}" for x in xs)


def docs(res: dict, table: str) -> str:
    m, c = res["machine"], res["config"]
    cold = {r.get("cold_cold") for r in res["rows"] if r["backend"] == "local" and "cold_cold" in r}
    link = (
        f"Linked loads (`load over its own storage link`): cold, and every loading process (each "
        f"coop2 rank, the plain load) reads the disk over a link of its own capped at "
        f"{c['link_mib_s']:g} MiB/s (a blkio cgroup per process, `benchmarks/storage_link.py`), "
        "as each rank's host reaches the store over its own link on a cluster: one rank's "
        "link, not this machine's one disk and page cache, bounds what it reads. Ranks with "
        "links of their own stand for hosts of their own, so the coop2 ranks exchange their "
        "parts over the gloo broadcast (loopback TCP), not by copying each other's memory."
        if c.get("link_mib_s")
        else ""
    )
    return f"""# Checkpoint benchmark

Produced by `.venv/bin/python benchmarks/checkpoint.py --size-gib {c["size_gib"]:g} --repeats {c["repeats"]} --write-docs`
(backends {", ".join(c["backends"])}; dtypes {", ".join(c["dtypes"])}; {res["elapsed_s"] / 60:.0f} minutes); raw
results in `results.json` of its `--out-dir`.

## Machine
- CPU: {m["cpu"]}, {m["cores"]} cores; memory {m["memory_gib"]} GiB; no GPU (the CUDA staging,
  pinned-memory and NCCL paths are not measured here)
- disk: {m["disk"]} (rotational={m["rotational"]}); kernel {m["kernel"]}
- Python {m["python"]}, torch {m["torch"]}, zstandard {m["zstandard"]}, safetensors {m["safetensors"]}
- load average (1/5/15 min) at the start: {_loads(m["loadavg_at_start"])}; at the end: {_loads(m["loadavg_at_end"])}
- **The machine is shared and noisy**: other jobs ran on its 2 cores and its disk during the
  run, and its speed drifts 2-3x between minutes. Absolute seconds are not reproducible; the
  paired ratios (neighbours in the same round) are what to compare.

## How it is measured
- State: a GPT-like model ({c["state_bytes_fp32"] / GIB:.2f} GiB fp32: weights N(0, 0.02), small
  biases, LayerNorm gains near 1, plus AdamW exp_avg/exp_avg_sq started at their stationary
  distribution for step 1000 under random gradients with per-row scales, then 5 real AdamW
  steps); `bf16` is the same state cast to bf16.
- {c["repeats"]} interleaved rounds: each round runs every method once, each save and each load
  in its own process, in an order shuffled from round to round (no method always follows the
  same one). Tables show medians over rounds;
  ratios are paired within a round, then the median is taken.
- CPU-s/GiB: CPU time of every thread of the process (user + system) in the timed region, per
  GiB of state. Load extra RSS/GiB: the load's peak RSS above its RSS just before (destination
  tensors already allocated and touched), per GiB of state.
- Local saves are durable when they return (DCP `sync_files`; ckptflow fdatasyncs each object
  as soon as it is written and the folders, never a whole-host sync; raw: fsync). Loads:
  warm (every file read once just before) and {"cold (page cache dropped)" if cold == {True} else "cold NOT measured (the page cache could not be dropped)"};
  each touches every byte (an xxh3 of every tensor) and is compared bitwise with the saved state.
  ckptflow reads an object the page cache does not hold with O_DIRECT, and one it holds from
  the cache (a warm load finds them all there).
- DCP `FileSystemWriter(thread_count={c["threads"]})`; ckptflow `threads={c["threads"]}`, defaults
  otherwise (`compress="auto"`, zstd level 1 = the tuned parameters).
- Async: two saves with an AdamW step between; the stall is the time until training may touch
  its tensors again (for DCP also until its async staging completed). ckptflow is `prepare`d
  first, as the training loop does after its first step (buffers pre-faulted in the background). `dcp-async`: no stager
  passed (DCP's default); `dcp-async-reused`: one `DefaultStager` (shared memory, async
  staging) reused by both saves. Incremental: a delta (`full_every=11`) after 10 AdamW steps at
  lr 1e-4; the entropy floor is the order-0 entropy of the byte planes of the cheapest of the
  tensor itself, XOR against the base and the zigzag integer difference, per tensor, over the
  full save's stored bytes. coop2: two gloo ranks on
  this host each load the whole state cooperatively (warm): each reads about half and copies
  the rest out of the other's memory (same host); `benchmarks/coop_load.py` also times two
  uncooperative ranks at once and the gloo broadcast. {link}

## Results

{table}"""

"""The child side of benchmarks/checkpoint.py: one save or load phase of one method per process.

Each phase runs in its own process so that its peak RSS (VmHWM) is its own. The parent passes a
JSON spec as the only argument; the child prints one line `RESULT <json>`.

The state is an LLM-shaped state dict (GPT-like fp32 weights plus AdamW exp_avg/exp_avg_sq,
made by real AdamW steps), generated once by the parent (`make_state`) and read from a
safetensors file outside any timed region. A bf16 run casts every tensor to bf16.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

from benchmarks import (  # noqa: E402
    llm_state,
    methods_baseline,
    methods_ckptflow,
    probes,
    storage_link,
)

RAW = ("raw", "raw-direct")  # methods that write random bytes, not the state
SAVERS = methods_baseline.SAVERS | methods_ckptflow.SAVERS
TRAINING_SAVERS = methods_baseline.TRAINING_SAVERS | methods_ckptflow.TRAINING_SAVERS
LOADERS = methods_baseline.LOADERS | methods_ckptflow.LOADERS


# -- save phases -------------------------------------------------------------------------------
def run_save(spec: dict) -> dict:
    meta = probes.read_json(os.path.join(spec["work"], "meta.json"))
    if spec["method"] in RAW:
        sd32, sd = {}, {}
    else:
        sd32, sd = llm_state.load_state(spec["work"], spec["dtype"])
    base_rss = probes.rss_gib("VmRSS")
    warm_up(spec, load=False)
    probes.settle()  # nothing an earlier phase left to the disk is billed to this one
    m = spec["method"]
    if m in TRAINING_SAVERS:
        out = TRAINING_SAVERS[m](spec, sd, sd32, meta["names"])
    else:
        out = SAVERS[m](spec, sd)
    final = out.pop("expect_state", sd)
    if sd:
        with open(spec["expect"], "w") as f:
            json.dump(llm_state.expectation(final), f)
    out["raw_bytes"] = llm_state.nbytes(final) if sd else spec["raw_bytes"]
    out["stored_bytes"] = probes.stored_bytes(spec["path"])
    out["rss_base_gib"], out["rss_peak_gib"] = base_rss, probes.rss_gib()
    return out


def warm_up(spec: dict, load: bool) -> None:
    """Save (and load) a tiny state with the same method first, so imports, lazy set-up and
    code pages are not billed to the measured call; every method gets the same treatment."""
    if spec["method"] in RAW:
        return
    tiny = llm_state.as_dtype(
        {"warm.a": torch.randn(4096), "warm.b": torch.randn(64, 64)}, spec["dtype"]
    )
    wspec = spec | {"path": spec["path"] + "-warmup", "step": 1}
    try:
        m = spec["method"]
        default = (
            methods_baseline.save_dcp if m.startswith("dcp") else methods_ckptflow.save_ckptflow
        )
        SAVERS.get(m, default)(wspec, tiny)
        if load:
            exp = llm_state.expectation(tiny)
            load_fn = LOADERS.get(m, methods_ckptflow.load_ckptflow)
            got = load_fn(wspec, exp, llm_state.template(exp))
            assert llm_state.digests(got) == llm_state.digests(tiny), "warm-up round trip differs"
    finally:
        probes.remove(wspec["path"])
        probes.remove(wspec["path"] + "-hashed")


# -- load phases -------------------------------------------------------------------------------
def _cache(spec: dict) -> bool:
    """Warm (every file read once) or cold (page cache dropped; also for "link"); True when it
    is cold."""
    if spec.get("cache") == "warm":
        probes.pre_read(spec["path"])
        return False
    return probes.drop_caches()


def _link(spec: dict):
    """For cache "link": this process's disk reads capped at spec["link_mib_s"] (a storage link
    of its own, as each rank's host has on a cluster: storage_link.py); else nothing."""
    if spec.get("cache") != "link":
        return contextlib.nullcontext()
    name = f"ckptflow-bench-{os.getpid()}"
    return storage_link.capped(name, spec["path"], spec["link_mib_s"])


def run_load(spec: dict) -> dict:
    """One timed load: into zeros allocated (and touched) before timing, then an xxh3 of every
    tensor; extra peak RSS = the peak during the load above the RSS before it."""
    if spec["method"] == "ckptflow-coop2":
        return run_coop_rank(spec)
    raw = spec["method"] == "raw"
    expect = {} if raw else probes.read_json(spec["expect"])
    load = LOADERS.get(spec["method"], methods_ckptflow.load_ckptflow)
    warm_up(spec, load=True)
    dst = None if raw else llm_state.template(expect)
    cold = _cache(spec)
    probes.settle()
    with _link(spec):
        probes.reset_peak_rss()
        base = probes.rss_gib("VmRSS")
        t0 = probes.clock()
        sd = load(spec, expect, dst)
        # touches every byte of every tensor, for every method
        got = {} if raw else llm_state.digests(sd)
        timed = probes.since(t0, "load")
    bad = sorted(k for k in expect.get("digests", {}) if got.get(k) != expect["digests"][k])
    if bad or set(got) != set(expect.get("digests", {})):
        raise SystemExit(f"{spec['method']}: loaded state differs from the saved one: {bad[:5]}")
    return timed | {
        "cold": cold,
        "bytes_read": spec.get("_bytes_read"),
        "rss_peak_gib": probes.rss_gib(),
        "rss_extra_gib": probes.rss_gib() - base,
    }


def run_coop_rank(spec: dict) -> dict:
    """One of M gloo ranks that all load the whole (replicated) state cooperatively."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(spec["port"]))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=spec["rank"], world_size=spec["world"])
    cold = None
    try:
        expect = probes.read_json(spec["expect"])
        import ckptflow.steps.checkpoint.checkpointer  # noqa: F401  (imported before the cache is dropped)

        ck = methods_ckptflow.ck_for(spec, cooperative=spec.get("cooperative", True))
        sd = llm_state.template(expect)
        if spec["rank"] == 0:
            cold = _cache(spec)
            probes.settle()
        with _link(spec):  # each rank its own link
            dist.barrier()
            probes.reset_peak_rss()
            base = probes.rss_gib("VmRSS")
            t0 = probes.clock()
            ck.load(sd, spec["step"])
            got = llm_state.digests(sd)
            timed = probes.since(t0, "load")
        if got != expect["digests"]:
            raise SystemExit(f"rank {spec['rank']}: loaded state differs from the saved one")
        ck.close()
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return timed | {
        "cold": cold,
        "bytes_read": ck.last_load.bytes_read,
        "bytes_received": ck.last_load.bytes_received,
        "bytes_local": ck.last_load.bytes_received_local,
        "rss_peak_gib": probes.rss_gib(),
        "rss_extra_gib": probes.rss_gib() - base,
    }


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    torch.set_num_threads(spec.get("torch_threads") or torch.get_num_threads())
    out = run_save(spec) if spec["phase"] == "save" else run_load(spec)
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

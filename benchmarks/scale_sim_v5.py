"""Per-rank manifests (format v5, issue 36) in the simulation: one rank's own save work, rank
0's coordination and one rank's load planning at a simulated world size (benchmarks/scale_sim.py
runs this beside the v4 phases, each world size in a process of its own).

Under v5 DCP saves without cross-rank coordination (dcp.save(use_collectives=False)): each
rank plans its own shards, writes its parts and a rank manifest of its chunks' records; only
(rank manifest name, digest, counts) go to rank 0, which writes the step index and claims the
COMMIT marker. A load of the same world size reads the index, its own rank manifest and rank
0's (the replicated entries) and plans against them. Nothing here holds every rank's chunks.

Timed (CPU seconds, peak RSS above the phase's start, as scale_sim.measure):

- own plan (rank 0, the rank with the most entries: its shards and every replicated entry):
  DCP's local save planning over its DTensors on a fake process group, then DCP's
  create_global_plan and finish_plan on that one plan (what DCP does without collectives);
- rank manifest (rank 0): built from its write results, serialised, parsed and validated back;
- own check (rank 0): its own objects checked present (a HEAD each on an object store);
- coordination (rank 0): the R gathered (name, digest, counts) records unpickled, the index
  built, serialised, parsed back and written, the COMMIT marker claimed;
- load plan (the last rank): the index, its own rank manifest and rank 0's read, parsed and
  validated, DCP Metadata built from them, DCP's create_local_plan over its DTensors.

The product's functions are called through `Protocol` (one place): `PRODUCT` when V-lead's v5
code is importable, else `STAND_IN`, built from DCP's APIs and the v4 manifest code as the
product does it; the report names which one ran (`protocol` in each row).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable
from dataclasses import dataclass

STEP, SAVE_ID, ROOT_ID = 1, "5" * 16, "r" * 16


@dataclass(frozen=True)
class Protocol:
    """The v5 functions the simulation times (see the module docstring)."""

    name: str
    local_plan: Callable  # (state_dict, rank) -> (final SavePlan, Metadata of its own entries)
    rank_manifest: Callable  # (job, metadata, write results, rank) -> (name, bytes), validated
    rank_record: Callable  # (rank, name, blob) -> the small record gathered to rank 0
    commit_index: Callable  # (job, storage, records) -> index bytes (written, COMMIT claimed)
    load_metadata: Callable  # (storage, step, rank, only) -> (Metadata, bytes read)
    load_planner: type | None = None  # the load planner the fast path uses (None: ours)


# -- the stand-in: DCP's APIs and the v4 manifest code, as the product will use them -------------
def _standin_local_plan(sd: dict, rank: int):
    from ckptflow.steps.checkpoint.writer import SafeSavePlanner
    from torch.distributed.checkpoint.planner import WriteItemType

    planner = SafeSavePlanner()
    planner.set_up_planner(sd, storage_meta=None, is_coordinator=rank == 0)
    plan = planner.create_local_plan()
    if rank != 0:  # replicated entries are rank 0's alone (DCP's gather deduplicated them)
        keep = [i for i in plan.items if i.type == WriteItemType.SHARD]
        plan.items[:] = keep
    plans, md = planner.create_global_plan([plan])  # one plan: DCP without collectives
    return planner.finish_plan(plans[0]), md


def _rank_name(rank: int) -> str:
    return f"manifest-{SAVE_ID}-r{rank:05d}.json"


def _standin_rank_manifest(job, md, results, rank: int):
    import json

    from ckptflow.steps.checkpoint.save_manifest import build_manifest

    from ckptflow.core import jsonfile
    from ckptflow.core import manifest as mf

    with jsonfile.collector_paused():
        m = build_manifest(job, md, results)
        m["rank"] = rank
        blob = mf.dumps(m)
        parsed = json.loads(blob)
    # (v4's validate checks that chunks tile each tensor: one rank's do not, so the stand-in
    # validates everything but the entries; V-lead's validator checks a rank's own chunks)
    mf.validate(parsed, only=set())
    return _rank_name(rank), blob


def _standin_rank_record(rank: int, name: str, blob: bytes) -> dict:
    import json

    from ckptflow.core import codec

    m = json.loads(blob)  # (the product counts as it builds)
    return {
        "rank": rank,
        "manifest": name,
        "xxh3": codec.digest(blob),
        "bytes": len(blob),
        "items": len(m["items"]),
        "objects": len(m["objects"]),
    }


def _standin_commit_index(job, st, records: list[dict]) -> bytes:
    import json
    import time

    from ckptflow.steps.checkpoint import commit

    from ckptflow.core import codec, jsonfile, layout

    index = {
        "format": "ckptflow-manifest",
        "format_version": 5,
        "index": True,
        "step": job.step,
        "save_id": job.save_id,
        "root_id": job.root_id,
        "world_size": job.world_size,
        "created_at": time.time(),
        "ranks": sorted(records, key=lambda r: r["rank"]),
    }
    blob = json.dumps(index, separators=(",", ":")).encode()
    back = jsonfile.loads(blob, what="index", max_bytes=64 << 20)
    if [r["rank"] for r in back["ranks"]] != list(range(job.world_size)):
        raise ValueError("index does not name every rank once")
    name = layout.manifest_name(job.save_id)
    st.write(f"{layout.step_dir(job.step)}/{name}", blob)
    commit.claim(job, commit.record(job, name, codec.digest(blob)))
    return blob


def _standin_load_metadata(st, step: int, rank: int, only: set[str]):
    from ckptflow.steps.checkpoint import dcp_metadata

    from ckptflow.core import codec, jsonfile, layout, rootreader

    folder = layout.step_dir(step)
    commit = rootreader.read_commit(st, step)
    blob = st.read(f"{folder}/{commit['manifest']}")
    if codec.digest(blob) != commit["manifest_xxh3"]:
        raise ValueError("index checksum")
    index = jsonfile.loads(blob, what="index", max_bytes=64 << 20)
    read = len(blob)
    got = []
    for r in dict.fromkeys((rank, 0)):
        rec = index["ranks"][r]
        b = st.read(f"{folder}/{rec['manifest']}")
        if codec.digest(b) != rec["xxh3"]:
            raise ValueError("rank manifest checksum")
        read += len(b)
        m = jsonfile.loads(b, what="rank manifest", max_bytes=512 << 20, max_depth=128)
        got.append(m)
    own = got[0]
    for other in got[1:]:  # rank 0's replicated entries: what the own manifest lacks
        for fqn, t in other["tensors"].items():
            own["tensors"].setdefault(fqn, t)
        own["values"] = sorted(set(own["values"]) | set(other["values"]))
        for key, it in other["items"].items():
            if it["fqn"] not in own["planner_data"]:
                own["items"][key] = it
        for k, v in other["planner_data"].items():
            own["planner_data"].setdefault(k, v)
    return dcp_metadata.metadata_from_manifest(own, only), read


STAND_IN = Protocol(
    "stand-in (DCP use_collectives=False planning + v4 manifest code)",
    _standin_local_plan,
    _standin_rank_manifest,
    _standin_rank_record,
    _standin_commit_index,
    _standin_load_metadata,
)


def _find(name: str, modules: list):
    """The first of `modules` that defines `name` (the design names a module; the code may
    keep a function beside its kin), else None."""
    return next((getattr(m, name) for m in modules if hasattr(m, name)), None)


def product() -> Protocol | None:
    """The product's v5 functions (the names of /work/v5-design.md), None until they exist."""
    import contextlib
    import importlib

    mods = []
    for name in ("rank_save", "rank_commit", "rank_load", "save_manifest"):
        with contextlib.suppress(ImportError):  # (a module the code does not have)
            mods.append(importlib.import_module(f"ckptflow.steps.checkpoint.{name}"))
    try:
        from ckptflow.core import rankmanifest
    except ImportError:
        return None
    names = ("local_plan", "rank_manifest", "rank_record", "commit_index", "load_metadata")
    found = [_find(n, [*mods, rankmanifest]) for n in names]
    if None in found:
        return None
    where = ", ".join(f"{f.__module__.split('.')[-1]}.{f.__name__}" for f in found)
    planner = _find("CoveredLoadPlanner", mods)
    return Protocol(f"ckptflow's v5 code ({where})", *found, planner)


def protocol() -> Protocol:
    """The product's v5 functions when they exist, else the stand-in."""
    return product() or STAND_IN


# -- the simulation -----------------------------------------------------------------------------
def _other_record(rank: int) -> dict:
    """What a rank not simulated in full sends rank 0 (its name, a digest, its counts)."""
    digest = hashlib.md5(f"rank {rank}".encode()).hexdigest()
    rec = {"rank": rank, "manifest": _rank_name(rank), "xxh3": digest, "bytes": 1 << 20}
    return rec | {"items": 4480, "objects": 1200}


def as_rank(ranks: int, rank: int, fn):
    """fn() with a fake process group of `ranks` in which this process is `rank`."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=ranks)
    try:
        return fn()
    finally:
        dist.destroy_process_group()


def job_for(ranks: int, st=None):
    from ckptflow.steps.checkpoint.save_job import SaveJob

    return SaveJob(storage=st, step=STEP, save_id=SAVE_ID, root_id=ROOT_ID, world_size=ranks)


def save_rank(proto: Protocol, lay, ranks: int, rank: int, measure, repeats: int = 1) -> dict:
    """`rank`'s own save work under v5, each piece through `measure`: its plan over its
    DTensors, its write results (our writer's, built: not timed), its rank manifest."""
    from benchmarks.scale_sim_inputs import dtensor_state, write_results

    out: dict = {}

    def plan():
        sd = dtensor_state(lay, ranks, rank)
        return measure(lambda: proto.local_plan(sd, rank), repeats)

    out["own_plan_s"], out["own_plan_peak"], (final, md) = as_rank(ranks, rank, plan)
    out["own_items"] = len(final.items)
    results = out["results"] = write_results(final, rank)
    s, out["rank_manifest_peak"], (name, blob) = measure(
        lambda: proto.rank_manifest(job_for(ranks), md, results, rank), repeats
    )
    out["rank_manifest_s"], out["name"], out["blob"] = s, name, blob
    out["rank_manifest_bytes"] = len(blob)
    return out


def commit_step(proto: Protocol, st, ranks: int, saved: dict[int, dict], measure, repeats=1):
    """Rank 0's coordination: every rank's record gathered (`saved`: the ranks simulated in
    full, by rank, their rank manifests written to `st`; the others' records made up), the
    index written and the COMMIT claimed. (seconds, peak, index bytes, gathered bytes)."""
    folder = f"step-{STEP:08d}"
    records = [_other_record(r) for r in range(ranks)]
    for r, got in saved.items():
        st.write(f"{folder}/{got['name']}", got["blob"])
        records[r] = proto.rank_record(r, got["name"], got["blob"])
    gathered = [pickle.dumps(r) for r in records]  # as gather_object sends them
    job = job_for(ranks, st)

    def coordinate():
        st.delete([f"{folder}/COMMIT"])  # (an earlier repeat's)
        return proto.commit_index(job, st, [pickle.loads(b) for b in gathered])

    s, peak, index = measure(coordinate, repeats)
    return s, peak, index, sum(map(len, gathered))


def load_rank(proto: Protocol, st, lay, ranks: int, rank: int, measure, repeats=1):
    """`rank`'s load planning: (seconds, peak, its LoadPlan, manifest bytes it read)."""
    from ckptflow.steps.checkpoint.reader import SafeLoadPlanner
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    from benchmarks.scale_sim_inputs import dtensor_state

    def planned():
        sd = dtensor_state(lay, ranks, rank)
        only = set(flatten_state_dict(sd)[0])

        def load():
            md, n = proto.load_metadata(st, STEP, rank, only)
            lp = (proto.load_planner or SafeLoadPlanner)()
            lp.set_up_planner(sd, md, is_coordinator=False)
            return lp.create_local_plan(), n

        s, peak, (lp, n) = measure(load, repeats)
        return s, peak, lp, n

    return as_rank(ranks, rank, planned)


def child(ranks: int, layers: int, repeats: int, measure) -> dict:
    """The v5 phases at `ranks` (see the module docstring); `measure` as scale_sim.measure."""
    import gc

    import torch
    from ckptflow.steps.checkpoint import commit as commit_mod

    from benchmarks.scale_sim_inputs import sim_storage, state_layout

    torch.set_num_threads(1)
    proto = protocol()
    lay = state_layout(layers)
    out = {"protocol": proto.name, "ranks": ranks, "tensors": len(lay[0]) + len(lay[1])}
    out["chunks"] = len(lay[0]) * ranks + len(lay[1])
    # (a) rank 0's own save work, and its own objects' check before the commit
    zero = save_rank(proto, lay, ranks, 0, measure, repeats)
    job = job_for(ranks)
    job.part_records = [p for wr in zero.pop("results") for p in wr.storage_data["parts"]]
    sizes = commit_mod.own_objects(job)
    st = job.storage = sim_storage(f"memory://scale-sim-v5-{ranks}-{id(out)}", sizes)
    out["own_check_s"], _, problem = measure(lambda: commit_mod.missing(job, sizes), repeats)
    if problem is not None:
        raise RuntimeError(problem)
    out["own_check_requests"] = type(st).requests // repeats
    out.update((k, v) for k, v in zero.items() if k not in ("name", "blob"))
    # the last rank's rank manifest (its own work is as rank 0's, which is timed)
    last = ranks - 1
    saved = {0: zero, last: save_rank(proto, lay, ranks, last, lambda f, n: (0, 0, f()))}
    saved[last].pop("results")
    out["last_manifest_bytes"] = saved[last]["rank_manifest_bytes"]
    gc.collect()
    # (b) rank 0's coordination: the gathered records, the index, the COMMIT marker
    s, peak, index, gathered = commit_step(proto, st, ranks, saved, measure, repeats)
    out.update(coord_s=s, coord_peak=peak, index_bytes=len(index), gather_bytes=gathered)
    out["rank0_written_bytes"] = out["rank_manifest_bytes"] + out["index_bytes"]
    del saved, zero
    gc.collect()
    # (c) the last rank's load planning
    s, peak, lp, n = load_rank(proto, st, lay, ranks, last, measure, repeats)
    out.update(load_plan_s=s, load_plan_peak=peak, load_items=len(lp.items), load_read_bytes=n)
    out["rank0_s"] = sum(out[k] for k in ("own_plan_s", "rank_manifest_s", "own_check_s"))
    out["rank0_s"] += out["coord_s"]
    return out

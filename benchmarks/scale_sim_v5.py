"""Per-rank manifests (format 5, issue 36) in the simulation: one rank's own save work, rank
0's coordination and one rank's load planning at a simulated world size (benchmarks/scale_sim.py
runs this beside the v4 phases, each world size in a process of its own).

Under v5 each rank runs DCP alone (dcp.save(no_dist=True): its local plan is its global
plan), writes its parts and a rank manifest of its own entries (its shards; the replicated
tensors and values it holds are its own too); only (rank manifest name, digest, counts) go to
rank 0, which writes the step index and claims the COMMIT marker. A load at the saved world
size reads the index and its own rank manifest. Nothing here holds every rank's chunks.

Timed (CPU seconds, peak RSS above the phase's start, as scale_sim.measure), calling
ckptflow's own v5 functions (`protocol()`; nothing re-implemented):

- own plan (rank 0): rank_save.local_plan over its DTensors on a fake process group of the
  simulated world size (DCP's local planning, create_global_plan and finish_plan of one rank);
- rank manifest (rank 0): rank_save.rank_manifest from its write results (built, serialised,
  parsed back and validated, as the writer's finish does before it writes it);
- own check (rank 0): its own objects checked present (commit.missing: a HEAD each on an
  object store, counted);
- coordination (rank 0): the R gathered records unpickled (as gather_object delivers them),
  rank_save.commit_index: the index built, checked, serialised, written, COMMIT claimed;
- load plan (the last rank): rank_load.load_metadata (COMMIT, the index and its own rank
  manifest read, checked against the index and validated; DCP Metadata from them), then
  rank_load.CoveredLoadPlanner's create_local_plan over its DTensors.

Ranks 0 and R-1 are simulated in full (their rank manifests are written to a store that
answers from memory); the other ranks' records are made up (a name, a digest, counts): rank 0
reads none of their manifests.
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
    load_planner: type  # the load planner a rank's own-manifest load plans with


def protocol() -> Protocol:
    """ckptflow's v5 functions (steps/checkpoint/rank_save.py, rank_load.py,
    ckptflow/core/rankmanifest.py): the code a save and a load run, nothing re-implemented."""
    from ckptflow.steps.checkpoint import rank_load, rank_save

    from ckptflow.core import rankmanifest

    return Protocol(
        "ckptflow's v5 code: rank_save.local_plan, rank_save.rank_manifest, "
        "rankmanifest.rank_record, rank_save.commit_index, rank_load.load_metadata, "
        "rank_load.CoveredLoadPlanner",
        rank_save.local_plan,
        rank_save.rank_manifest,
        rankmanifest.rank_record,
        rank_save.commit_index,
        rank_load.load_metadata,
        rank_load.CoveredLoadPlanner,
    )


# -- the simulation -----------------------------------------------------------------------------
def _other_record(rank: int) -> dict:
    """What a rank not simulated in full sends rank 0 (its name, a digest, its counts)."""
    digest = hashlib.md5(f"rank {rank}".encode()).hexdigest()
    from ckptflow.core import layout

    name = layout.rank_manifest_name(SAVE_ID, rank)
    rec = {"rank": rank, "manifest": name, "xxh3": digest, "bytes": 1 << 20}
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
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    from benchmarks.scale_sim_inputs import dtensor_state

    def planned():
        sd = dtensor_state(lay, ranks, rank)
        only = set(flatten_state_dict(sd)[0])

        def load():
            md, n = proto.load_metadata(st, STEP, rank, only)
            lp = proto.load_planner()
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

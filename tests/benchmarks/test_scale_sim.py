"""benchmarks/scale_sim.py at tiny sizes: what the v4 and v5 (per-rank manifests) phases
build is right, and the report shows both (correctness only: no timings checked)."""

from __future__ import annotations

import json

import pytest

from benchmarks import scale_sim, scale_sim_v5
from benchmarks.scale_sim_inputs import local_plan, sim_storage, state_layout, write_results
from ckptflow.core import manifest as mf
from ckptflow.core import rootreader

RANKS, LAYERS = 4, 1


def untimed(fn, repeats=1):
    return 0.0, 0, fn()


def _read_items(plan) -> set[tuple]:
    """What a LoadPlan reads: (destination, stored chunk, offsets into it, lengths)."""
    return {
        (
            ri.dest_index.fqn,
            tuple(ri.dest_index.offset or ()),
            ri.storage_index.fqn,
            tuple(ri.storage_index.offset or ()),
            tuple(ri.storage_offsets),
            tuple(ri.lengths),
        )
        for ri in plan.items
    }


@pytest.fixture(scope="module")
def v5_step():
    """Every rank's v5 save at RANKS simulated ranks, committed to a simulated store."""
    proto = scale_sim_v5.protocol()
    lay = state_layout(LAYERS)
    saved = {}
    for rank in range(RANKS):
        saved[rank] = scale_sim_v5.save_rank(proto, lay, RANKS, rank, untimed)
    st = sim_storage("memory://test-scale-sim-v5", {})
    scale_sim_v5.commit_step(proto, st, RANKS, saved, untimed)
    return proto, lay, saved, st


def _v4_manifest(lay) -> dict:
    """The one manifest v4 writes for the same save (rank 0's global plan of every rank's)."""
    from ckptflow.steps.checkpoint.save_manifest import build_manifest
    from ckptflow.steps.checkpoint.writer import SafeSavePlanner

    planner = SafeSavePlanner()
    planner.set_up_planner({}, storage_meta=None, is_coordinator=True)
    plans, md = planner.create_global_plan([local_plan(RANKS, r, lay) for r in range(RANKS)])
    results = [wr for r, p in enumerate(plans) for wr in write_results(p, r)]
    return build_manifest(scale_sim_v5.job_for(RANKS), md, results)


def test_each_shard_is_in_one_rank_manifest_and_each_rank_holds_the_replicated_entries(v5_step):
    """Together the rank manifests hold v4's entries: each rank's shards in its own alone;
    replicated tensors and values in every rank's (each rank's own, rank_save.py: a load
    then reads only its own manifest; the merge keeps one)."""
    _, lay, saved, _ = v5_step
    v4 = _v4_manifest(lay)
    owner: dict[str, list[int]] = {}
    for rank, got in saved.items():
        m = json.loads(got["blob"])
        assert m["rank"] == rank
        for key in m["items"]:
            owner.setdefault(key, []).append(rank)
    assert set(owner) == set(v4["items"])
    sharded = {fqn for fqn, _ in lay[0]}
    for key, ranks in owner.items():
        if v4["items"][key]["fqn"] in sharded:
            assert len(ranks) == 1, key
        else:  # a replicated tensor or a value
            assert sorted(ranks) == list(range(RANKS)), key


def test_the_step_is_committed_and_names_every_rank(v5_step):
    _, _, saved, st = v5_step
    commit = rootreader.read_commit(st, scale_sim_v5.STEP)
    index = st.read(f"step-{scale_sim_v5.STEP:08d}/{commit['manifest']}")
    text = index.decode()
    for got in saved.values():
        assert got["name"] in text


@pytest.mark.parametrize("rank", [0, RANKS - 1])
def test_a_v5_load_plans_the_reads_a_v4_load_plans(v5_step, rank):
    from ckptflow.steps.checkpoint import dcp_metadata
    from ckptflow.steps.checkpoint.reader import SafeLoadPlanner

    from benchmarks.scale_sim_inputs import dtensor_state

    proto, lay, _, st = v5_step
    v4 = mf.validate(json.loads(mf.dumps(_v4_manifest(lay))))

    def v4_plan():
        sd = dtensor_state(lay, RANKS, rank)
        planner = SafeLoadPlanner()
        planner.set_up_planner(sd, dcp_metadata.metadata_from_manifest(v4), is_coordinator=False)
        return planner.create_local_plan()

    want = scale_sim_v5.as_rank(RANKS, rank, v4_plan)
    _, _, got, read = scale_sim_v5.load_rank(proto, st, lay, RANKS, rank, untimed)
    assert _read_items(got) == _read_items(want)
    assert len(got.items) == len(want.items) > len(lay[0])
    assert 0 < read < len(mf.dumps(v4))  # the index and two rank manifests, not every rank's


def test_a_v5_row_has_every_phase_and_the_section_shows_v4_beside_it(tmp_path, capsys):
    v5_row = scale_sim_v5.child(RANKS, LAYERS, 1, scale_sim.measure)
    keys = [k for k, _ in scale_sim.scale_sim_report.V5_PHASES] + ["own_check_s", "gather_bytes"]
    assert all(v5_row[k] >= 0 for k in keys)
    assert v5_row["rank0_written_bytes"] == v5_row["rank_manifest_bytes"] + v5_row["index_bytes"]
    assert v5_row["load_items"] > len(state_layout(LAYERS)[0])
    v4_row = scale_sim.child(RANKS, LAYERS, 1)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        f"RUN --formats v4 | at abc1234+\n{json.dumps(v4_row)}\n"
        f"RUN --formats v5 | at def5678\n{json.dumps(v5_row)}\n"
    )
    assert scale_sim.main(["--rows", str(rows), "--layers", "1", "--sweep-layers", "1"]) == 0
    text = capsys.readouterr().out
    assert "### v5: per-rank manifests" in text and v5_row["protocol"] in text
    assert "scale_sim.py --formats v4` (at abc1234+) and " in text
    assert "scale_sim.py --formats v5` (at def5678)" in text
    assert f"| {RANKS} | {v5_row['chunks']:,} | {v5_row['own_plan_s']:.3f} |" in text
    assert "| rank-0 time, s |" in text and "(projected from 4 ranks)" in text
    assert text.index("### v5") > text.index("| at 1,024 ranks, full model | measured")

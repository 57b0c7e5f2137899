"""Preflight and straggler detection (issue 18): the real measurements on one rank, and the
verdicts on forked gloo ranks from injected figures and step times (no timing is asserted)."""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from ckptflow.steps.lib import preflight
from ckptflow.steps.lib.preflight import (
    FIGURES,
    PREFLIGHT_EXIT,
    PREFLIGHT_PEER_EXIT,
    PreflightFailed,
    PreflightSpec,
)
from ckptflow.steps.lib.straggler import StragglerFound, StragglerMonitor, StragglerSpec

from ckptflow.core.storage import Storage
from tests.steps import distworkers as dw

FAST = {"matmul_gflops": 50.0, "store_write_mib_s": 800.0, "store_read_mib_s": 900.0}
FAST |= {"allreduce_gib_s": 1.0, "latency_us": 100.0}


def test_one_rank_measures_every_figure_and_leaves_no_probe(tmp_path, caplog):
    caplog.set_level("INFO")
    dinfo = SimpleNamespace(rank=0, world_size=1, device=torch.device("cpu"), is_main=True)
    storage = Storage(str(tmp_path))
    got = preflight.measure(dinfo, storage, PreflightSpec(factor=3.0, store_mib=1))
    assert list(got) == [name for name, _ in FIGURES]
    assert got["matmul_gflops"] > 0 and got["store_write_mib_s"] > 0
    assert got["store_read_mib_s"] > 0
    assert not list((tmp_path / "preflight").iterdir())  # the probe is deleted
    lineage = FakeLineage()
    names = preflight.run(dinfo, storage, PreflightSpec(factor=3.0, store_mib=1), lineage)
    assert len(names) == 1 and names[0].startswith("pod ")
    assert "preflight passed" in caplog.text and "matmul_gflops" in caplog.text
    assert "preflight_matmul_gflops" in lineage.metrics[0]
    # alone, nothing was measured with peers: no collective figure reaches MLflow
    assert not {"preflight_allreduce_gib_s", "preflight_latency_us"} & set(lineage.metrics[0])
    assert json.loads(lineage.tags["preflight"])[0]["rank"] == 0


class FakeLineage:
    """What the MLflow side receives: tags and metrics by step."""

    def __init__(self) -> None:
        self.tags: dict = {}
        self.metrics: dict = {}

    def set_tags(self, tags: dict) -> None:
        self.tags.update(tags)

    def log_metrics(self, metrics: dict, step: int) -> None:
        self.metrics.setdefault(step, {}).update(metrics)


# -- forked gloo ranks ------------------------------------------------------------------------
def _launch(world: int, target, *args) -> list[int]:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    port = dw.free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, target, args)) for r in range(world)]
    return dw.run_all(procs, 240)


def _entry(rank: int, world: int, port: int, target, args) -> None:
    dw.rank_env(rank, world, port)
    os.environ.update(CKPTFLOW_POD_NAME=f"rank-pod-{rank}", CKPTFLOW_NODE_NAME=f"node-{rank}")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dinfo = SimpleNamespace(
        rank=rank, world_size=world, device=torch.device("cpu"), is_main=rank == 0
    )
    try:
        out = target(dinfo, *args)
    except Exception as exc:  # noqa: BLE001 - the verdict is what the test reads
        out = {"error": type(exc).__name__, "message": str(exc)}
        out["exit_code"] = getattr(exc, "exit_code", None)
    Path(args[0], f"rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()
    os._exit(0)


def _read(out: Path, world: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def _preflight_worker(dinfo, out: str, slow_times: int) -> dict:
    calls = []

    def injected(dinfo, storage, spec) -> dict:
        calls.append(1)
        figures = dict(FAST)
        if dinfo.rank == 1 and len(calls) <= slow_times:
            figures["matmul_gflops"] = 12.5  # 4x slower than its peers' median
        return figures

    spec = PreflightSpec(factor=3.0)
    names = preflight.run(dinfo, Storage(out), spec, FakeLineage(), measure=injected)
    return {"names": names, "calls": len(calls)}


def test_a_rank_slower_than_the_factor_twice_fails_preflight_naming_its_pod_and_node(tmp_path):
    assert _launch(3, _preflight_worker, str(tmp_path), 2) == [0, 0, 0]
    got = _read(tmp_path, 3)
    assert got[1]["exit_code"] == PREFLIGHT_EXIT
    assert got[1]["message"].startswith("preflight failed: rank 1 (pod rank-pod-1 on node node-1)")
    assert "4.0x slower than its peers' median at matmul_gflops" in got[1]["message"]
    for peer in (got[0], got[2]):  # they restart in place to meet its replacement
        assert peer["exit_code"] == PREFLIGHT_PEER_EXIT and "rank-pod-1" in peer["message"]
        assert peer["error"] == PreflightFailed.__name__


def test_a_rank_slow_only_once_passes_after_the_second_measurement(tmp_path):
    assert _launch(2, _preflight_worker, str(tmp_path), 1) == [0, 0]
    got = _read(tmp_path, 2)
    assert [g["calls"] for g in got] == [2, 2]  # measured again, on every rank
    assert got[0]["names"] == ["pod rank-pod-0 on node node-0", "pod rank-pod-1 on node node-1"]


def _straggler_worker(dinfo, out: str, fail: bool) -> dict:
    names = [f"pod rank-pod-{r} on node node-{r}" for r in range(dinfo.world_size)]
    lineage = FakeLineage() if dinfo.is_main else None
    monitor = StragglerMonitor(
        StragglerSpec(every=2, factor=2.0, windows=2, fail=fail), dinfo, names, lineage
    )
    reported_at = None
    for step in range(1, 13):
        local = 0.03 if dinfo.rank == 1 and step > 4 else 0.01  # rank 1 slows after step 4
        try:
            monitor.add(step, local, 0.05)
        except StragglerFound as exc:
            return {"found": exc.rank, "step": step, "message": str(exc)}
        if monitor.reported and reported_at is None:
            reported_at = step
    return {"reported": list(monitor.reported), "at": reported_at, "tags": lineage and lineage.tags}


def test_a_persistent_straggler_is_reported_by_rank_pod_and_node(tmp_path):
    assert _launch(3, _straggler_worker, str(tmp_path), False) == [0, 0, 0]
    got = _read(tmp_path, 3)
    # windows end at steps 2, 4, 6, 8: slow in the windows ending at 6 and 8
    assert [(g["reported"], g["at"]) for g in got] == [([1], 8)] * 3
    assert got[0]["tags"]["straggler"].startswith(
        "straggler: rank 1 (pod rank-pod-1 on node node-1) has been 3.0x slower"
    )


def test_a_failing_straggler_stops_every_rank_at_the_same_step(tmp_path):
    assert _launch(2, _straggler_worker, str(tmp_path), True) == [0, 0]
    got = _read(tmp_path, 2)
    assert [(g["found"], g["step"]) for g in got] == [(1, 8), (1, 8)]


def test_a_lone_rank_logs_no_collective_figures_it_did_not_measure():
    """A single rank has no peer: its all_reduce "bandwidth" is infinite and was logged to
    MLflow as 1.8e308 (seen on a fine-tune's run page). Only measured figures are logged."""
    from ckptflow.steps.lib import preflight

    class Lineage:
        def __init__(self):
            self.metrics, self.tags = {}, {}

        def log_metrics(self, m, step):
            self.metrics.update(m)

        def set_tags(self, t):
            self.tags.update(t)

    lg = Lineage()
    figures = {"compute_gflops": [12.0], "allreduce_gib_s": [math.inf], "latency_us": [0.0]}
    preflight.record(lg, figures, ["pod p on node n"])
    assert lg.metrics == {"preflight_compute_gflops": 12.0}


def test_a_lone_rank_shows_its_collective_figures_as_not_applicable(tmp_path, caplog):
    """Alone, a rank has nobody to all_reduce with: the table said `allreduce_gib_s inf`
    (issue 38, point 10). Not measured is n/a on screen and null in the preflight tag."""
    caplog.set_level("INFO")
    dinfo = SimpleNamespace(rank=0, world_size=1, device=torch.device("cpu"), is_main=True)
    storage = Storage(str(tmp_path))
    spec = PreflightSpec(factor=3.0, store_mib=1)
    got = preflight.measure(dinfo, storage, spec)
    assert got["allreduce_gib_s"] is None and got["latency_us"] is None
    lineage = FakeLineage()
    preflight.run(dinfo, storage, spec, lineage)
    row = next(s for s in caplog.text.splitlines() if s.lstrip().startswith("0  "))
    assert "inf" not in row and row.split()[4:6] == ["n/a", "n/a"], row

    def strict(name):
        raise AssertionError(f"{name} is not JSON")

    tag = json.loads(lineage.tags["preflight"], parse_constant=strict)[0]
    assert tag["allreduce_gib_s"] is None and tag["latency_us"] is None

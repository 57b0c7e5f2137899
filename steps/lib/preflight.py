"""Preflight: before training, each rank measures what this job needs of its node, and a rank
much slower than its peers fails before it slows every step of the run.

Measured on every rank, all ranks at once (about a second by default): compute (GFLOP/s of
matmuls run for 0.4 s),
write and read bandwidth to the checkpoint store (`--preflight-store-mib` MiB under
`<run-root>/preflight/`, deleted afterwards), collective bandwidth (an all_reduce) and latency
(one-element all_reduces) with its peers. The figures are gathered on every rank, logged by
rank 0 as one table row per rank (with its pod and node) and recorded in MLflow (metrics
`preflight_<figure>` at step r for rank r, and the table as the run's `preflight` tag).

A rank more than `--preflight-factor` times slower than its peers' median on any figure
(`outliers.slow_ranks`), in a first measurement and again in a second one (a busy moment of a
shared node is not a slow node), fails preflight: it logs which figure, its pod and its node, and makes
its pod fail at once (it stops its torchrun agent, so no in-place restart reruns it on the same
node) with PREFLIGHT_EXIT; the rank template's `retryStrategy.affinity.nodeAntiAffinity` keeps
its retry off that node. The other ranks exit too (PREFLIGHT_PEER_EXIT), and their agents
restart them in place to meet the replacement. Collective figures are shared by all ranks (each
waits for the slowest), so they rarely single one out; compute and storage do.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from ckptflow.steps.lib.outliers import Slow, slow_ranks
from ckptflow.steps.lib.plumbing import StepError

from ckptflow import env

log = logging.getLogger("ckptflow.preflight")

PREFLIGHT_EXIT = 3  # this rank is too slow: its pod fails, its retry avoids the node
PREFLIGHT_PEER_EXIT = 4  # a peer is too slow: restart in place and meet its replacement
# (figure, higher is better), in the table's order
FIGURES = (
    ("matmul_gflops", True),
    ("store_write_mib_s", True),
    ("store_read_mib_s", True),
    ("allreduce_gib_s", True),
    ("latency_us", False),
)
HIGHER = dict(FIGURES)
PROBE_DIR = "preflight"


@dataclass(frozen=True)
class PreflightSpec:
    """How preflight measures and judges (from the loop arguments)."""

    factor: float  # slower than this times the peers' median fails; 0 disables preflight
    store_mib: int = 4  # MiB written and read back per rank
    matmul_n: int = 256  # side of the square matmul
    compute_s: float = 0.4  # how long the matmuls run (several CPU-quota periods)
    allreduce_mib: int = 4
    allreduce_reps: int = 4
    latency_reps: int = 20

    @classmethod
    def from_config(cls, cfg) -> PreflightSpec:
        return cls(factor=cfg.preflight_factor, store_mib=cfg.preflight_store_mib)


class PreflightFailed(StepError):
    """A rank failed preflight (this one, or a peer)."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best(fn, reps: int) -> float:
    """The shortest of `reps` timed calls of `fn` (what the node can do, not what a busy
    moment let it do: noise only ever adds time)."""
    best = math.inf
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return max(best, 1e-9)


def _barrier() -> None:
    """Ranks measure at the same moment: a node's load shared by all ranks (a neighbour's
    job) then slows them alike, and what singles one out is its own slowness."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def measure_compute(device: torch.device, n: int, seconds: float) -> float:
    """GFLOP/s of n x n float32 matmuls run back to back for `seconds` (one warm-up first).
    Sustained, not the best single one: a CPU quota (a throttled node) lets a short burst
    run at full speed and then stops it for the rest of its period (100 ms by default)."""
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    (a @ b).sum().item()
    _barrier()
    done, start = 0, time.perf_counter()
    while (took := time.perf_counter() - start) < seconds:
        a @ b
        _sync(device)
        done += 1
    return 2.0 * n**3 * done / max(took, 1e-9) / 1e9


def _total(fn, reps: int) -> float:
    """Seconds for `reps` calls of `fn` (sustained, as the compute figure), ranks together."""
    _barrier()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return max((time.perf_counter() - start) / reps, 1e-9)


def measure_store(storage, rank: int, mib: int, reps: int = 3) -> tuple[float, float]:
    """(write, read) MiB/s over `reps` writes and reads of one `mib` MiB object under
    preflight/ in `storage`; deleted after."""
    rel = f"{PROBE_DIR}/rank-{rank:05d}.probe"
    data = os.urandom(mib * 2**20)
    back: list[bytes] = []
    try:
        wrote = _total(lambda: storage.write(rel, data), reps)
        read = _total(lambda: back.append(storage.read(rel, limit=len(data) + 1)), reps)
    finally:
        storage.delete([rel])
    if any(b != data for b in back):
        raise StepError(f"preflight: {storage.url(rel)} read back differs from what was written")
    return mib / wrote, mib / read


def measure_collective(device: torch.device, mib: int, reps: int, lat_reps: int):
    """(all_reduce GiB/s of a `mib` MiB tensor, microseconds per one-element all_reduce), the
    best of their repetitions; (None, None) alone: with nobody to reduce with there is nothing
    to measure (an "inf" bandwidth reached the table and MLflow)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None, None
    big = torch.ones(mib * 2**18, device=device)  # float32: 4 bytes each
    one = torch.ones(1, device=device)

    def reduce(t: torch.Tensor) -> None:
        dist.all_reduce(t)
        _sync(device)

    reduce(big)
    bandwidth = mib / 1024 / _best(lambda: reduce(big), reps)
    reduce(one)
    return bandwidth, _best(lambda: reduce(one), lat_reps) * 1e6


def measure(dinfo, storage, spec: PreflightSpec) -> dict[str, float]:
    """This rank's figures (FIGURES)."""
    flops = measure_compute(dinfo.device, spec.matmul_n, spec.compute_s)
    write, read = measure_store(storage, dinfo.rank, spec.store_mib)
    bandwidth, latency = measure_collective(
        dinfo.device, spec.allreduce_mib, spec.allreduce_reps, spec.latency_reps
    )
    out = [flops, write, read, bandwidth, latency]
    return dict(zip((name for name, _ in FIGURES), out, strict=True))


def gather(figures: dict[str, float | None], device: torch.device) -> dict[str, list[float | None]]:
    """Every rank's figures, on every rank: {figure: [rank 0's, rank 1's, ...]}; None for a
    figure a rank did not measure (NaN on the wire)."""
    row = torch.tensor(
        [math.nan if figures[name] is None else figures[name] for name, _ in FIGURES],
        dtype=torch.float64,
    )
    if not dist.is_initialized() or dist.get_world_size() == 1:
        rows = [row]
    else:
        row = row.to(device)
        rows = [torch.empty_like(row) for _ in range(dist.get_world_size())]
        dist.all_gather(rows, row)
    cols = torch.stack([r.cpu() for r in rows]).T.tolist()
    return {
        name: [None if math.isnan(v) else v for v in col]
        for (name, _), col in zip(FIGURES, cols, strict=True)
    }


def _cell(value: float | None) -> str:
    """One figure in the table: n/a when it was not measured."""
    return f"{'n/a' if value is None else format(value, '.1f'):>17}"


def _judge(figures: dict[str, list[float | None]], factor: float) -> list[Slow]:
    """The slow ranks, on the figures every rank measured."""
    measured = {k: v for k, v in figures.items() if None not in v}
    return slow_ranks(measured, HIGHER, factor)


def identities() -> list[str]:
    """ "pod P on node N" of every rank, on every rank (one all_gather_object)."""
    pod, node = env.pod_identity()
    mine = f"pod {pod}" + (f" on node {node}" if node else "")
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [mine]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine)
    return [str(x) for x in out]


def table(figures: dict[str, list[float]], names: list[str]) -> str:
    """One row per rank: its figures, then its pod and node."""
    lines = ["rank  " + "  ".join(f"{name:>17}" for name, _ in FIGURES) + "  where"]
    for rank, where in enumerate(names):
        cells = [_cell(figures[name][rank]) for name, _ in FIGURES]
        lines.append(f"{rank:>4}  " + "  ".join(cells) + f"  {where}")
    return "\n".join(lines)


def describe(slow: Slow, names: list[str], factor: float) -> str:
    """One line naming the slow rank, where it runs and what was slow."""
    worse = "lower" if HIGHER[slow.metric] else "higher"
    return (
        f"rank {slow.rank} ({names[slow.rank]}) is {slow.ratio:.1f}x slower than its peers' "
        f"median at {slow.metric}: {slow.value:.1f} ({worse}) against {slow.peers_median:.1f} "
        f"(limit {factor:g}x)"
    )


COLLECTIVE = ("allreduce_gib_s", "latency_us")  # the figures measured with peers


def record(lineage, figures: dict[str, list[float]], names: list[str]) -> None:
    """The table in MLflow: `preflight_<figure>` at step r for rank r, and preflight.json."""
    # A lone rank has no peer to reduce with: its collective figures (None) were never
    # measured and must not reach MLflow (an inf was stored as 1.8e308).
    alone = len(names) == 1
    for rank in range(len(names)):
        logged = {
            f"preflight_{k}": v[rank]
            for k, v in figures.items()
            if v[rank] is not None and math.isfinite(v[rank]) and not (alone and k in COLLECTIVE)
        }
        lineage.log_metrics(logged, rank)
    rows = [
        {"rank": r, "where": names[r], **{k: v[r] for k, v in figures.items()}}
        for r in range(len(names))
    ]
    lineage.set_tags({"preflight": json.dumps(rows, default=str)[:4900]})


def leave_pod() -> None:
    """Make this rank's pod fail now: stop the torchrun agent (else it restarts this worker
    in place, on the same node). Nothing to do outside torchrun."""
    agent = env.torchelastic_agent_pid()
    if agent is not None and agent > 1:
        os.kill(agent, signal.SIGTERM)


def run(dinfo, storage, spec: PreflightSpec, lineage=None, *, measure=measure) -> list[str]:
    """Measure (`measure(dinfo, storage, spec)`: tests inject figures), gather, log, record
    and judge; every rank's "pod P on node N".

    Raises PreflightFailed on every rank when one rank is too slow."""
    if spec.factor <= 0:
        return identities()
    log.info("preflight: measuring compute, storage and collectives")
    names = identities()
    start = time.perf_counter()
    figures = gather(measure(dinfo, storage, spec), dinfo.device)
    slow = _judge(figures, spec.factor)
    if slow:
        # A rank must be slow twice: a busy moment of a shared node must not fail it.
        log.info("preflight: %s; measuring again", describe(slow[0], names, spec.factor))
        first = {s.rank for s in slow}
        figures = gather(measure(dinfo, storage, spec), dinfo.device)
        slow = [s for s in _judge(figures, spec.factor) if s.rank in first]
    if dinfo.is_main:
        log.info("preflight (%.2fs):\n%s", time.perf_counter() - start, table(figures, names))
        if lineage is not None:
            record(lineage, figures, names)
    if not slow:
        log.info("preflight passed: no rank is %gx slower than its peers", spec.factor)
        return names
    line = describe(slow[0], names, spec.factor)
    if lineage is not None:
        lineage.set_tags({"preflight_failed": line})
    mine = [s for s in slow if s.rank == dinfo.rank]
    if mine:
        leave_pod()
        raise PreflightFailed(
            f"preflight failed: {describe(mine[0], names, spec.factor)}", PREFLIGHT_EXIT
        )
    raise PreflightFailed(
        f"preflight: a peer failed ({line}); restarting to meet its replacement",
        PREFLIGHT_PEER_EXIT,
    )

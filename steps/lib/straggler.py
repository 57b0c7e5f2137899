"""Straggler detection during training: per-rank step times compared every N steps.

In synchronous training every rank waits for the slowest at each collective, so the wall time
of a step is the same on all ranks and cannot say which one is slow. Ranks are compared on
their *busy* time per step instead (`busy_clock`): the time the training thread ran on a CPU
or was ready to run but was not given one (throttled by its CPU quota, or crowded out), read
from Linux's schedstat. Waiting for a peer in a collective blocks the thread and counts in
neither, so a rank's busy time is its own work. Where schedstat is missing the collective-free
part of the step is used (the batch fetch and the optimizer update). On GPU the thread waits
for kernels, so busy time follows wall time: a GPU straggler needs CUDA-event timing of the
compute, not done here. Every `every` steps each rank's mean over the window (and its mean
wall step time, for the log) is all_gathered; a rank more than `factor` times
its peers' median in `windows` consecutive comparisons is a persistent straggler
(`outliers.StragglerTracker`): a warning naming its rank, pod and node, an MLflow tag
`straggler` (rank 0), and, when `fail`, `StragglerFound` on every rank (the loop saves first).
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass

import torch
import torch.distributed as dist
from ckptflow.steps.lib.outliers import StragglerTracker

log = logging.getLogger("ckptflow.straggler")
SCHEDSTAT = "/proc/thread-self/schedstat"


def busy_clock() -> float | None:
    """Seconds this thread has run plus waited runnable for a CPU (schedstat's first two
    fields, in ns); None where the kernel does not report them."""
    try:
        with open(SCHEDSTAT) as f:
            ran, waited = f.read().split()[:2]
        return (int(ran) + int(waited)) / 1e9
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class StragglerSpec:
    """How often and how strictly ranks are compared (from the loop arguments)."""

    every: int = 10  # compare every N steps; 0 never
    factor: float = 2.0  # slower than this times the peers' median
    windows: int = 3  # consecutive slow comparisons that make a persistent straggler
    fail: bool = False  # a persistent straggler fails the run (after a save)

    @classmethod
    def from_config(cls, cfg) -> StragglerSpec:
        return cls(
            every=cfg.straggler_every,
            factor=cfg.straggler_factor,
            windows=cfg.straggler_windows,
            fail=cfg.straggler_fail,
        )


class StragglerFound(Exception):
    """A persistent straggler with `fail` set: every rank saves and leaves."""

    def __init__(self, rank: int, line: str) -> None:
        super().__init__(line)
        self.rank = rank


class StragglerMonitor:
    """Feed it each step's times (`add`); every `every` steps it compares ranks (a collective:
    every rank calls `add` at every step)."""

    def __init__(self, spec: StragglerSpec, dinfo, names: list[str], lineage=None) -> None:
        self.spec, self.dinfo, self.names, self.lineage = spec, dinfo, names, lineage
        self.enabled = spec.every > 0 and dinfo.world_size > 1
        self.tracker = StragglerTracker(spec.factor, spec.windows) if self.enabled else None
        self.local: list[float] = []
        self.wall: list[float] = []
        self.reported: dict[int, float] = {}  # rank -> ratio when it was reported

    def add(self, step: int, busy_s: float, wall_s: float) -> None:
        if not self.enabled:
            return
        self.local.append(busy_s)
        self.wall.append(wall_s)
        if step % self.spec.every == 0:
            self.compare(step, *self.exchange())

    def exchange(self) -> tuple[list[float], list[float]]:
        """Every rank's mean busy and wall step time over the window (an all_gather)."""
        n = max(1, len(self.local))
        mine = torch.tensor([sum(self.local) / n, sum(self.wall) / n], dtype=torch.float64)
        self.local, self.wall = [], []
        mine = mine.to(self.dinfo.device)
        rows = [torch.empty_like(mine) for _ in range(self.dinfo.world_size)]
        dist.all_gather(rows, mine)
        both = torch.stack([r.cpu() for r in rows]).T.tolist()
        return both[0], both[1]

    def compare(self, step: int, local: list[float], wall: list[float]) -> None:
        """Judge one window (every rank the same gathered figures, the same verdict)."""
        ratios, new = self.tracker.update(local)
        for rank in new:
            line = (
                f"straggler: rank {rank} ({self.names[rank]}) has been {ratios[rank]:.1f}x "
                f"slower than its peers' median for {self.spec.windows} comparisons of "
                f"{self.spec.every} steps (step {step}; busy {1e3 * local[rank]:.2f} ms a step "
                f"against {1e3 * statistics.median(local[:rank] + local[rank + 1 :]):.2f} ms, "
                f"wall {1e3 * wall[rank]:.2f} ms)"
            )
            self.reported[rank] = ratios[rank]
            if self.dinfo.is_main or rank == self.dinfo.rank:
                log.warning("%s", line)
            if self.lineage is not None:
                self.lineage.set_tags({"straggler": line})
                self.lineage.log_metrics({"straggler_ratio": ratios[rank]}, step)
            if self.spec.fail:
                raise StragglerFound(rank, line)

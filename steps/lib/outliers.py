"""Which rank is slow: each rank's figure against the median of its peers' (pure, no torch).

Preflight and straggler detection share the rule. A rank is compared with the median of the
*other* ranks, not of all of them: with two ranks the median of all is the mean of both, so a
rank four times slower would look only 2.5 times slower; its peers' median is the fast one.
The ratio says how many times slower the rank is (1.0: as its peers; above 1: slower), for a
figure where higher is better (a bandwidth) or lower is better (a time, a latency).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Slow:
    """One rank slower than `factor` times its peers' median on one figure."""

    rank: int
    metric: str
    value: float
    peers_median: float
    ratio: float  # times slower than the peers' median


def _ratio(value: float, peers: float, higher_is_better: bool) -> float:
    """How many times slower `value` is than `peers`; a failed measurement (0, NaN) is inf."""
    if not math.isfinite(value) or not math.isfinite(peers):
        return math.inf if not math.isfinite(value) else 1.0
    if higher_is_better:
        return peers / value if value > 0 else (math.inf if peers > 0 else 1.0)
    return value / peers if peers > 0 else (math.inf if value > 0 else 1.0)


def ratios(values: Sequence[float], *, higher_is_better: bool) -> list[float]:
    """For each rank, how many times slower it is than the median of the other ranks
    (1.0 for a rank without peers)."""
    out = []
    for i, value in enumerate(values):
        peers = [float(v) for j, v in enumerate(values) if j != i]
        out.append(
            _ratio(float(value), statistics.median(peers), higher_is_better) if peers else 1.0
        )
    return out


def slow_ranks(
    figures: Mapping[str, Sequence[float]], higher_is_better: Mapping[str, bool], factor: float
) -> list[Slow]:
    """Every (rank, figure) whose ratio exceeds `factor`, the slowest first."""
    found = []
    for metric, values in figures.items():
        for rank, r in enumerate(ratios(values, higher_is_better=higher_is_better[metric])):
            if r > factor:
                median = statistics.median([v for j, v in enumerate(values) if j != rank])
                found.append(Slow(rank, metric, float(values[rank]), float(median), r))
    return sorted(found, key=lambda s: (-s.ratio, s.rank, s.metric))


class StragglerTracker:
    """Persistent stragglers: ranks slower than `factor` times their peers' median in
    `windows` consecutive comparisons of step times. Every rank feeds it the same gathered
    times, so every rank reaches the same verdict at the same step."""

    def __init__(self, factor: float, windows: int) -> None:
        if factor < 1.0 or windows < 1:
            raise ValueError("a straggler factor must be at least 1 and windows at least 1")
        self.factor, self.windows = factor, windows
        self.streak: dict[int, int] = {}

    def update(self, times: Sequence[float]) -> tuple[list[float], list[int]]:
        """(each rank's ratio, the ranks that have just become persistent stragglers): a rank
        is reported once per streak, when its streak reaches `windows`."""
        r = ratios(times, higher_is_better=False)
        new = []
        for rank, ratio in enumerate(r):
            if ratio > self.factor:
                self.streak[rank] = self.streak.get(rank, 0) + 1
                if self.streak[rank] == self.windows:
                    new.append(rank)
            else:
                self.streak.pop(rank, None)
        return r, new

"""The planner's storage footprint: the retention module run on a simulated timeline of saves
(one GC after each save), for `ckptflow plan` (docs/planner.md, "Storage footprint under a
retention policy").

Pure Python (no torch). Split from ckptflow.core.planner, which sizes the checkpoints and
picks the interval this simulates.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ckptflow.core.policy_syntax import parse_duration
from ckptflow.core.retention import CatalogEntry, Policy, plan_retention

TIMELINE_POINTS = 100
MAX_SIMULATED_SAVES = 100_000  # about 40 s of simulation
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Footprint:
    """Checkpoint storage over a simulated run under the retention policy."""

    interval_s: float  # compute time between simulated saves
    saves: int  # checkpoints saved over the run
    peak_bytes: float  # most bytes stored at once (after a save, before its GC)
    average_bytes: float  # time-average bytes stored over the run, ramp-up included
    final_bytes: float  # bytes stored at the end of the run
    peak_kept: int  # most checkpoints kept at once (after GC)
    final_kept: int  # checkpoints kept at the end
    best_reserve_bytes: float  # room counted for keep-best rules (see docs/planner.md)
    timeline: list[tuple[float, int, float]] = field(default_factory=list)  # (wall s, kept, bytes)


def _slim(catalog: dict, sizes: dict, slimmed: set, now: float, age: float, ratio: float) -> float:
    """Shrink the checkpoints a `slim=AGE` policy demotes; the bytes that frees."""
    latest = max(catalog)
    bases = {e.base_step for e in catalog.values() if e.base_step is not None}
    freed = 0.0
    for step, e in catalog.items():
        if step in slimmed or step == latest or step in bases or now - e.committed_at <= age:
            continue
        freed += sizes[step] * (1.0 - ratio)
        sizes[step] *= ratio
        slimmed.add(step)
    return freed


def simulate_footprint(
    size: float,
    delta_size: float | None,
    full_every: int,
    interval_s: float,
    stall_s: float,
    run_s: float,
    policy: str | None,
    progress: Progress | None = None,
    slim_ratio: float = 1.0,
) -> Footprint:
    """Bytes stored over a run that saves every `interval_s` of compute, with GC after each save.

    Save k (k = 1 .. run_s // interval_s) commits at wall time k (interval + stall), counted
    from a UTC midnight so thinning buckets line up as they would in a real run; failures are
    left out. Keep-best rules need metrics a plan cannot know: they are left out of the
    simulated policy and K full checkpoints per rule are counted on top (an upper bound).
    A policy's `slim=AGE` shrinks kept checkpoints older than AGE to `slim_ratio` of their
    size (weights / everything), except the latest and any base of a kept delta (ckptflow.core.
    slim: a delta keeps its base's optimizer objects referenced).
    """
    saves = int(run_s // interval_s)
    if saves > MAX_SIMULATED_SAVES:
        raise ValueError(
            f"{saves} saves to simulate: the interval ({interval_s:g} s) is too short for this "
            "run length; give a longer --interval"
        )
    parsed = Policy.parse(policy) if policy else None
    best_k = sum(k for _, _, k in parsed.keep_best) if parsed else 0
    simulated = (
        Policy(parsed.keep_last, parsed.thinning, (), parsed.keep_full, parsed.keep_delta)
        if parsed
        else None
    )
    period = interval_s + stall_s
    slimmed: set[int] = set()
    catalog: dict[int, CatalogEntry] = {}
    sizes: dict[int, float] = {}
    stored = level = peak = area = 0.0  # level: stored + keep-best reserve, after GC
    peak_kept = deleted = 0
    last_full = 0
    every = max(1, math.ceil(saves / TIMELINE_POINTS))
    timeline: list[tuple[float, int, float]] = []
    for k in range(1, saves + 1):
        now = k * period
        area += level * period
        full = (k - 1) % full_every == 0 or delta_size is None
        last_full = k if full else last_full
        catalog[k] = CatalogEntry(k, now, "full" if full else "delta", None if full else last_full)
        sizes[k] = size if full else float(delta_size)
        stored += sizes[k]
        peak = max(peak, stored + min(best_k, deleted) * size)
        if simulated is not None:
            for step in plan_retention(catalog.values(), simulated, now).delete:
                del catalog[step]
                stored -= sizes.pop(step)
                deleted += 1
        if parsed is not None and parsed.slim and slim_ratio < 1.0:
            stored -= _slim(catalog, sizes, slimmed, now, parse_duration(parsed.slim), slim_ratio)
        level = stored + min(best_k, deleted) * size
        peak_kept = max(peak_kept, len(catalog))
        if k % every == 0 or k == saves:  # at most about TIMELINE_POINTS samples, after GC
            timeline.append((now, len(catalog), level))
        if progress is not None and (k % 1000 == 0 or k == saves):
            progress(k, saves)
    end = run_s + saves * stall_s
    area += level * (end - saves * period)
    reserve = min(best_k, deleted) * size
    return Footprint(
        interval_s, saves, peak, area / end, level, peak_kept, len(catalog), reserve, timeline
    )

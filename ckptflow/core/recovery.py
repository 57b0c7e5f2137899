"""Recovery point and time (RPO/RTO) of a checkpointing plan, and solving for targets.

Pure Python (no torch). The formulas are documented in docs/planner.md ("RPO and RTO"):

- RPO, the work lost when a failure strikes, measured from the last committed checkpoint:
  expected (tau + d) / 2 (+ W when async), worst case tau + d (+ W when async): a failure just
  before a save commits falls back a whole period (and, async, the background write W);
- RTO, the time from the failure until training runs again: detection + rescheduling + load
  (S_h / B_r) + warm-up;
- targets: the longest interval whose worst-case RPO meets `--rpo`, and the least read
  bandwidth whose RTO meets `--rto`, or why they cannot be met.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 2**30
# The default split of a lumped restart cost (`--restart`: detect + reschedule + warm up).
DEFAULT_DETECT_S = 60.0  # a dead pod or a hung collective noticed (liveness, NCCL timeout)
DEFAULT_RESCHEDULE_S = 300.0  # pods scheduled again, images pulled, ranks rendezvoused
DEFAULT_WARMUP_S = 240.0  # compile, allocator and data-loader warm-up before full speed


# The settings a gang's detection follows (issue 34), with the workflows' defaults:
DEFAULT_PG_TIMEOUT_S = 120.0  # the steps' --pg-timeout-s (ckptflow.contract LoopArgs)
DEFAULT_NODE_GRACE_S = 50.0  # platform.node_monitor_grace_s (--node-monitor-grace-period)
DEFAULT_NODE_LOSS_TOLERATION_S = 60.0  # platform.gpu_node_loss_toleration_s
# what a pod without its own toleration gets (0 in that setting: none rendered), from the
# DefaultTolerationSeconds admission plugin (kubernetes plugin/pkg/admission/defaulttolerationseconds)
KUBERNETES_TOLERATION_S = 300.0


def gang_detect_s(pg_timeout_s: float, node_grace_s: float, toleration_s: float) -> float:
    """From a failure until every rank of the gang is out, so that all can come back:

        detect = max(pg_timeout, node_grace + toleration)

    The survivors leave when their collective times out (pg_timeout); a silently lost node's
    rank is only deleted, and retried by Argo, once its node turned NotReady (node_grace) and
    its toleration of the node-loss taints ran out (toleration; 0 = none rendered: 300 s).
    The first of the two notices the failure, but the gang restarts only after the second:
    a min() would promise an RTO that a silent node loss cannot meet. A crash that closes
    its sockets is noticed at once and costs less; the planner plans for the silent case."""
    return max(pg_timeout_s, node_grace_s + (toleration_s or KUBERNETES_TOLERATION_S))


@dataclass(frozen=True)
class RestartParts:
    """What a restart costs besides loading the checkpoint, in seconds."""

    detect_s: float  # from the failure to the run noticing it
    reschedule_s: float  # pods back, images pulled, rendezvous done
    warmup_s: float  # from the loaded state to full training speed

    @property
    def fixed_s(self) -> float:
        """Everything but the load."""
        return self.detect_s + self.reschedule_s + self.warmup_s

    @classmethod
    def split(cls, restart_s: float) -> RestartParts:
        """A lumped restart cost, split in the default proportions (1 : 5 : 4)."""
        total = DEFAULT_DETECT_S + DEFAULT_RESCHEDULE_S + DEFAULT_WARMUP_S
        return cls(
            restart_s * DEFAULT_DETECT_S / total,
            restart_s * DEFAULT_RESCHEDULE_S / total,
            restart_s * DEFAULT_WARMUP_S / total,
        )


@dataclass(frozen=True)
class Recovery:
    """RPO and RTO at one interval, and what the targets need (None: no target given)."""

    interval_s: float  # tau, compute time between checkpoints
    stall_s: float  # d, time training stops per save
    background_s: float  # W, the background write after an async snapshot (0 when sync)
    rpo_expected_s: float  # work lost by an average failure
    rpo_worst_s: float  # work lost by a failure just before a save commits
    lost_over_run_s: float  # expected failures x expected RPO
    detect_s: float
    reschedule_s: float
    load_s: float  # S_h / B_r
    warmup_s: float
    rto_s: float  # detect + reschedule + load + warm-up
    rpo_target_s: float | None = None
    rto_target_s: float | None = None
    interval_needed_s: float | None = None  # longest tau meeting the RPO target
    read_gib_s_needed: float | None = None  # least read GiB/s per host meeting the RTO target
    problems: tuple[str, ...] = ()  # why a target cannot be met (empty: both can)

    @property
    def feasible(self) -> bool:
        """True when every given target can be met."""
        return not self.problems


def rpo(interval_s: float, stall_s: float, background_s: float) -> tuple[float, float]:
    """(expected, worst-case) work lost per failure, from the last committed checkpoint."""
    period = interval_s + stall_s
    return period / 2.0 + background_s, period + background_s


def interval_for_rpo(target_s: float, stall_s: float, background_s: float) -> tuple[float, str]:
    """The longest interval whose worst-case RPO is at most `target_s`, and '' or why none is.

    Async saves also need tau >= W (the next snapshot waits for the last background write)."""
    tau = target_s - stall_s - background_s
    if tau <= 0 or tau < background_s:
        least = stall_s + 2.0 * background_s
        return max(tau, 0.0), (
            f"RPO {fmt(target_s)} cannot be met: a save alone takes {fmt(stall_s)} of stall"
            + (f" + {fmt(background_s)} of background write" if background_s else "")
            + f"; the RPO must exceed {fmt(least)} (faster writes or smaller checkpoints)"
        )
    return tau, ""


def read_for_rto(target_s: float, parts: RestartParts, per_host_bytes: float) -> tuple[float, str]:
    """The least read bandwidth per host (GiB/s) whose RTO is at most `target_s`, and '' or
    why none is (the fixed parts alone reach the target)."""
    room = target_s - parts.fixed_s
    if room <= 0:
        return math.inf, (
            f"RTO {fmt(target_s)} cannot be met at any read bandwidth: detection "
            f"{fmt(parts.detect_s)} + rescheduling {fmt(parts.reschedule_s)} + warm-up "
            f"{fmt(parts.warmup_s)} already take {fmt(parts.fixed_s)} (shorten them with "
            "--detect/--reschedule/--warmup)"
        )
    return per_host_bytes / room / GIB, ""


def recovery(
    *,
    interval_s: float,
    stall_s: float,
    background_s: float,
    per_host_bytes: float,
    read_gib_s: float,
    parts: RestartParts,
    expected_failures: float,
    rpo_target_s: float | None = None,
    rto_target_s: float | None = None,
) -> Recovery:
    """RPO and RTO of a plan at `interval_s`, and what the targets need."""
    expected, worst = rpo(interval_s, stall_s, background_s)
    load_s = per_host_bytes / (read_gib_s * GIB)
    problems: list[str] = []
    tau = bandwidth = None
    if rpo_target_s is not None:
        tau, why = interval_for_rpo(rpo_target_s, stall_s, background_s)
        problems += [why] if why else []
    if rto_target_s is not None:
        bandwidth, why = read_for_rto(rto_target_s, parts, per_host_bytes)
        problems += [why] if why else []
    return Recovery(
        interval_s=interval_s,
        stall_s=stall_s,
        background_s=background_s,
        rpo_expected_s=expected,
        rpo_worst_s=worst,
        lost_over_run_s=expected * expected_failures,
        detect_s=parts.detect_s,
        reschedule_s=parts.reschedule_s,
        load_s=load_s,
        warmup_s=parts.warmup_s,
        rto_s=parts.fixed_s + load_s,
        rpo_target_s=rpo_target_s,
        rto_target_s=rto_target_s,
        interval_needed_s=tau,
        read_gib_s_needed=bandwidth,
        problems=tuple(problems),
    )


def fmt(s: float) -> str:
    """A short duration for messages: '7.8 s', '24.9 min', '1.7 h'."""
    for unit, width in (("h", 3600), ("min", 60)):
        if s >= 2 * width:
            return f"{s / width:.1f} {unit}"
    return f"{s:.1f} s"

"""Recovery point and time (RPO/RTO) of a checkpointing plan, and solving for targets.

Pure Python (no torch). The formulas are documented in docs/planner.md ("RPO and RTO"):

- RPO, the work lost when a failure strikes, measured from the last committed checkpoint:
  expected (tau + d) / 2 (+ W when async), worst case tau + d (+ W when async): a failure just
  before a save commits falls back a whole period (and, async, the background write W);
- RTO, the time from the failure until training runs again: detection + rescheduling + load
  (S_h / B_r) + warm-up;
- targets: the longest interval whose worst-case RPO meets `--rpo`, and the least read
  bandwidth whose RTO meets `--rto`, or why they cannot be met;
- with the local tier (issue 35, `--local-interval`, `--replicas`): a node loss resumes from the
  newest local step every rank's piece survives in (its own node's copy, or a peer's replica),
  so the RPO follows the local interval and the load reads local disk and one peer fetch
  instead of object storage; without replicas a lost node's pieces are gone with it and a node
  loss resumes from object storage as before.
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
class LocalTier:
    """The node-local tier of a plan (bandwidths per host, GiB/s)."""

    interval_s: float  # compute time between local saves (pretrain.local_every x step time)
    replicas: int  # copies of each rank's piece on other nodes (pretrain.replicas)
    write_gib_s: float  # local disk write per host
    read_gib_s: float  # local disk read per host at restore
    peer_gib_s: float  # node-to-node bandwidth per host: replication and a peer fetch

    def __post_init__(self) -> None:
        for key in ("interval_s", "write_gib_s", "read_gib_s", "peer_gib_s"):
            value = getattr(self, key)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"local tier {key} must be positive, got {value!r}")
        if not 0 <= self.replicas <= 1000:
            raise ValueError(f"replicas must be 0 to 1000, got {self.replicas!r}")


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
    # where a node loss resumes from: "store" (object storage), or "peer" (the local tier:
    # survivors' own copies, the lost ranks' pieces from a replica)
    source: str = "store"
    store_bytes: float = 0.0  # bytes per host the recovery reads from object storage
    local_interval_s: float | None = None  # the local tier's interval (None: no local tier)
    replicas: int = 0
    notes: tuple[str, ...] = ()  # what the local tier cannot give (not a missed target)

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


def local_terms(
    tier: LocalTier, per_host_bytes: float, snapshot_s: float | None
) -> tuple[float, float, float, float]:
    """(stall d_l, background W_l, load L_l, effective read GiB/s) of the local tier.

    A local save is async like a durable one when there is a snapshot (d_l = the snapshot,
    then the local write in the background), else sync (d_l = the local write). A rank's
    newest piece only survives its node once replicated: R copies over the peer link join
    the background. At restore the survivors read their own copies while a replaced rank
    fetches its piece from a peer and reads it: L_l = S_h / B_peer + S_h / B_local_read."""
    write_s = per_host_bytes / (tier.write_gib_s * GIB)
    replicate_s = tier.replicas * per_host_bytes / (tier.peer_gib_s * GIB)
    stall = snapshot_s if snapshot_s is not None else write_s
    background = (write_s if snapshot_s is not None else 0.0) + replicate_s
    load = per_host_bytes / (tier.peer_gib_s * GIB) + per_host_bytes / (tier.read_gib_s * GIB)
    return stall, background, load, per_host_bytes / load / GIB if load else math.inf


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
    tier: LocalTier | None = None,
    snapshot_s: float | None = None,
) -> Recovery:
    """RPO and RTO of a plan at `interval_s`, and what the targets need. With a local `tier`
    that keeps replicas, a node loss resumes from it (local_terms): its interval, stall and
    background make the RPO, its load the RTO, and nothing is read from object storage."""
    notes: tuple[str, ...] = ()
    source, store_bytes = "store", per_host_bytes
    if tier is not None and tier.replicas < 1:
        notes = (
            "replicas 0: a lost node's local pieces are gone with it, so a node loss resumes "
            "from object storage (the RPO and RTO above); only a crash that keeps the node "
            "(a worker or pod restart on it) resumes from the local tier; set --replicas 1",
        )
    elif tier is not None:
        stall_s, background_s, _, read_gib_s = local_terms(tier, per_host_bytes, snapshot_s)
        interval_s, source, store_bytes = tier.interval_s, "peer", 0.0
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
        source=source,
        store_bytes=store_bytes,
        local_interval_s=None if tier is None else tier.interval_s,
        replicas=0 if tier is None else tier.replicas,
        notes=notes,
    )


def fmt(s: float) -> str:
    """A short duration for messages: '7.8 s', '24.9 min', '1.7 h'."""
    for unit, width in (("h", 3600), ("min", 60)):
        if s >= 2 * width:
            return f"{s / width:.1f} {unit}"
    return f"{s:.1f} s"

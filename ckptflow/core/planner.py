"""Checkpoint planner: size, save stall, interval, work lost and storage cost of a training run.

Pure Python (no torch). The formulas are documented in docs/planner.md; in short:

- size = params x (weight + optimizer + master bytes per parameter), sharded evenly over hosts;
- stall: sync = size per host / write bandwidth; async = size per host / snapshot bandwidth;
- interval: Young sqrt(2 d M) and Daly's higher-order formula (the recommendation), with d the
  stall and M the job's mean time between failures; async also needs the interval to cover the
  background write;
- work lost per failure = (interval + stall) / 2 (+ the background write when async) + restart;
- storage: the retention module run on a simulated timeline of saves (one GC after each save;
  ckptflow.core.footprint);
- the local tier (`local_interval_s`, `replicas`): a node loss resumes from it, so the RPO and
  RTO follow its interval and local/peer bandwidths (ckptflow.core.recovery.local_terms).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

import ckptflow.core.recovery as rec
from ckptflow.core.footprint import Footprint, Progress, simulate_footprint
from ckptflow.core.retention import Policy

GIB = 2**30
GB = 1e9  # storage is priced per decimal GB
MONTH_S = 730 * 3600.0  # a billing month: 730 hours, as cloud price lists use
PRECISION_BYTES = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "none": 0.0}
_COUNT = re.compile(r"(\d+(?:\.\d*)?(?:e\d+)?|\.\d+)([kmbgt]?)")
_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def precision_bytes(text: str | float) -> float:
    """Bytes per parameter for a precision name (bf16, fp32, ...) or a plain number."""
    if isinstance(text, int | float):
        return float(text)
    name = text.strip().lower()
    if name in PRECISION_BYTES:
        return PRECISION_BYTES[name]
    try:
        return float(name)
    except ValueError:
        names = ", ".join(PRECISION_BYTES)
        msg = f"unknown precision {text!r}: use one of {names} or bytes per parameter"
        raise ValueError(msg) from None


def parse_count(text: str | float) -> float:
    """A parameter count such as 300B, 7e9, 1.5T or 70M (K, M, B/G, T suffixes)."""
    if isinstance(text, int | float):
        return float(text)
    m = _COUNT.fullmatch(text.strip().lower())
    if not m:
        raise ValueError(f"bad parameter count {text!r}: write e.g. 300B, 7e9, 1.5T or 70M")
    return float(m[1]) * _SCALE[m[2]]


def young_interval(stall_s: float, mtbf_s: float) -> float:
    """Young (1974): compute time between checkpoints sqrt(2 d M)."""
    return math.sqrt(2.0 * stall_s * mtbf_s)


def daly_interval(stall_s: float, mtbf_s: float) -> float:
    """Daly (2006) higher-order optimum of the compute time between checkpoints.

    sqrt(2dM) [1 + (1/3) sqrt(d/2M) + (1/9) (d/2M)] - d when d < 2M, else M.
    """
    if stall_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = stall_s / (2.0 * mtbf_s)
    return young_interval(stall_s, mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - stall_s


@dataclass(frozen=True)
class PlanInputs:
    """What the planner needs to know about a run (bandwidths per host, in GiB/s)."""

    params: float  # number of model parameters
    gpus: int  # GPUs in the job
    write_gib_s: float  # measured checkpoint write bandwidth per host, GiB/s
    mtbf_s: float  # mean time between failures, seconds (of the job or of one node)
    run_s: float  # training time the run needs without failures or saves, seconds
    weight_bytes: float = 2.0  # bytes per parameter of the saved weights (bf16 = 2)
    optimizer_bytes: float = 8.0  # bytes per parameter of optimizer state (AdamW fp32 m, v = 8)
    master_bytes: float = 0.0  # bytes per parameter of saved fp32 master weights (4), if any
    gpus_per_host: int = 8  # GPUs per host (the unit that writes in parallel)
    mtbf_per: str = "job"  # "job": mtbf_s is the job's; "node": per host, job = node / hosts
    snapshot_gib_s: float | None = None  # device-to-host copy bandwidth per host (async stall)
    read_gib_s: float | None = None  # read bandwidth per host at restart (default: write)
    restart_s: float = 600.0  # restart cost besides loading: reschedule, start, warm up
    policy: str | None = None  # retention policy string (None: keep every checkpoint)
    delta_ratio: float | None = None  # stored size of a delta relative to a full checkpoint
    full_every: int = 1  # every Nth save is full, the others deltas (needs delta_ratio)
    price_gb_month: float = 0.02  # storage price per decimal GB and month
    interval_s: float | None = None  # force this interval for the footprint (default: Daly's)
    detect_s: float | None = None  # restart part: failure noticed (given parts replace restart_s)
    reschedule_s: float | None = None  # restart part: pods back and rendezvoused
    warmup_s: float | None = None  # restart part: loaded state to full speed
    rpo_s: float | None = None  # target: worst-case work lost per failure
    rto_s: float | None = None  # target: failure to training again
    grace_s: float | None = None  # terminationGracePeriodSeconds: a preemption save's time
    # the local tier (issue 35): None = off; replicas on other nodes; per-host bandwidths
    # (local disk write, read, node-to-node; defaults: write_gib_s, local write, local write)
    local_interval_s: float | None = None
    replicas: int = 0
    local_write_gib_s: float | None = None
    local_read_gib_s: float | None = None
    peer_gib_s: float | None = None

    def __post_init__(self) -> None:
        positive = {"params": self.params, "gpus": self.gpus, "write_gib_s": self.write_gib_s}
        positive |= {
            "mtbf_s": self.mtbf_s,
            "run_s": self.run_s,
            "gpus_per_host": self.gpus_per_host,
        }
        positive |= {"full_every": self.full_every}
        for key in (
            "snapshot_gib_s",
            "read_gib_s",
            "interval_s",
            "delta_ratio",
            "rpo_s",
            "rto_s",
            "grace_s",
            "local_interval_s",
            "local_write_gib_s",
            "local_read_gib_s",
            "peer_gib_s",
        ):
            if getattr(self, key) is not None:
                positive[key] = getattr(self, key)
        for key, value in positive.items():
            if not value > 0:
                raise ValueError(f"{key} must be positive, got {value!r}")
        if self.mtbf_per not in ("job", "node"):
            raise ValueError(f"mtbf_per must be 'job' or 'node', not {self.mtbf_per!r}")
        if self.full_every > 1 and self.delta_ratio is None:
            raise ValueError("full_every > 1 needs delta_ratio (stored delta size / full size)")
        parts = (self.detect_s, self.reschedule_s, self.warmup_s)
        if any(p is not None and not (p >= 0 and math.isfinite(p)) for p in parts):
            raise ValueError("detect, reschedule and warm-up times must be finite and >= 0")
        if any(p is not None for p in parts) and self.restart_s != 600.0:
            raise ValueError("give the restart cost or its parts (detect, reschedule, warm-up)")
        if self.policy is not None:
            Policy.parse(self.policy)  # a bad policy fails here, with the parser's message
        if not 0 <= self.replicas <= 1000:
            raise ValueError(f"replicas must be 0 to 1000, got {self.replicas!r}")
        hosts = math.ceil(self.gpus / self.gpus_per_host)
        if self.replicas and self.replicas >= hosts:
            raise ValueError(
                f"replicas {self.replicas} needs more than {self.replicas} hosts (each replica "
                f"is on another host) and the job has {hosts}; use at most {hosts - 1}"
            )
        local = ("replicas", "local_write_gib_s", "local_read_gib_s", "peer_gib_s")
        if self.local_interval_s is None and any(getattr(self, k) for k in local):
            raise ValueError("the local tier's settings need its interval (--local-interval)")

    def local_tier(self) -> rec.LocalTier | None:
        """The local tier, bandwidth defaults filled in (None: off)."""
        if self.local_interval_s is None:
            return None
        write = self.local_write_gib_s or self.write_gib_s
        return rec.LocalTier(
            self.local_interval_s,
            self.replicas,
            write,
            self.local_read_gib_s or write,
            self.peer_gib_s or write,
        )


@dataclass(frozen=True)
class ModePlan:
    """The interval and its consequences for one save mode (sync or async)."""

    mode: str  # "sync" (training waits for the write) or "async" (waits for the snapshot)
    stall_s: float  # d: time training stops per checkpoint
    young_interval_s: float  # Young's optimum compute time between checkpoints
    daly_interval_s: float  # Daly's optimum compute time between checkpoints
    interval_s: float  # recommended: Daly's, raised to cover the background write when async
    lost_per_failure_s: float  # expected work lost per failure, restart included
    expected_failures: float  # failures expected over the run at this interval
    expected_wall_s: float  # expected wall-clock time of the run (first-order model)
    efficiency: float  # run_s / expected_wall_s


@dataclass(frozen=True)
class PlanResult:
    """Everything `ckptflow plan` reports."""

    hosts: int
    bytes_per_param: float
    size_bytes: float  # one full checkpoint, all hosts
    size_per_host_bytes: float
    delta_bytes: float | None  # one delta checkpoint, all hosts
    write_s: float  # full write per host: the sync stall, the async background time
    snapshot_s: float | None  # device-to-host copy per host: the async stall
    load_s: float  # reading a checkpoint back per host at restart
    restart_total_s: float  # restart_s + load_s
    job_mtbf_s: float
    modes: list[ModePlan]
    recommended: str  # the mode whose interval the footprint uses
    footprint: Footprint
    cost_month_peak: float  # storage cost of one month at the peak footprint
    cost_month_average: float  # storage cost of one month at the average footprint
    cost_run: float  # average footprint x price x expected run duration in months
    recovery: rec.Recovery | None = None  # RPO/RTO at the footprint's interval, and targets
    preempt_save_s: float = 0.0  # a preemption save until committed: snapshot (async) + write
    warnings: list[str] = field(default_factory=list)  # what the plan cannot promise
    inputs: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """A JSON-ready dict."""
        return asdict(self)


def _mode_plan(
    mode: str, stall_s: float, write_s: float, job_mtbf_s: float, run_s: float, restart_s: float
) -> ModePlan:
    young = young_interval(stall_s, job_mtbf_s)
    daly = daly_interval(stall_s, job_mtbf_s)
    background = write_s if mode == "async" else 0.0
    # async: the next snapshot must not start before the previous write ended (else it stalls)
    interval = max(daly, background)
    # a failure before the background write commits falls back one more checkpoint
    lost = (interval + stall_s) / 2.0 + background + restart_s
    busy = run_s * (1.0 + stall_s / interval)
    wall = busy / (1.0 - lost / job_mtbf_s) if lost < job_mtbf_s else math.inf
    return ModePlan(
        mode,
        stall_s,
        young,
        daly,
        interval,
        lost,
        wall / job_mtbf_s,
        wall,
        run_s / wall if math.isfinite(wall) else 0.0,
    )


def plan(inputs: PlanInputs, progress: Progress | None = None) -> PlanResult:
    """Size, stalls, intervals, work lost and storage footprint of a run.

    `progress(done, total)` is called now and then while the footprint is simulated.
    """
    i = inputs
    hosts = math.ceil(i.gpus / i.gpus_per_host)
    bpp = i.weight_bytes + i.optimizer_bytes + i.master_bytes
    size = i.params * bpp
    per_host = size / hosts
    write_s = per_host / (i.write_gib_s * GIB)
    snapshot_s = per_host / (i.snapshot_gib_s * GIB) if i.snapshot_gib_s else None
    load_s = per_host / ((i.read_gib_s or i.write_gib_s) * GIB)
    parts = restart_parts(i)
    restart = parts.fixed_s + load_s
    mtbf = i.mtbf_s / hosts if i.mtbf_per == "node" else i.mtbf_s
    modes = [_mode_plan("sync", write_s, write_s, mtbf, i.run_s, restart)]
    if snapshot_s is not None:
        modes.append(_mode_plan("async", snapshot_s, write_s, mtbf, i.run_s, restart))
    chosen = modes[-1]
    delta = size * i.delta_ratio if i.delta_ratio else None
    interval = i.interval_s or chosen.interval_s
    fp = simulate_footprint(
        size,
        delta,
        i.full_every,
        interval,
        chosen.stall_s,
        i.run_s,
        i.policy,
        slim_ratio=i.weight_bytes / bpp,
        progress=progress,
    )
    wall = chosen.expected_wall_s
    recovery = rec.recovery(
        interval_s=interval,
        stall_s=chosen.stall_s,
        background_s=write_s if chosen.mode == "async" else 0.0,
        per_host_bytes=per_host,
        read_gib_s=i.read_gib_s or i.write_gib_s,
        parts=parts,
        expected_failures=chosen.expected_failures,
        rpo_target_s=i.rpo_s,
        rto_target_s=i.rto_s,
        tier=i.local_tier(),
        snapshot_s=snapshot_s,
    )
    preempt_s = write_s + (snapshot_s if chosen.mode == "async" else 0.0)
    local_notes = list(recovery.notes)
    if i.local_interval_s is not None and i.local_interval_s >= interval:
        local_notes.append(
            f"the local interval ({i.local_interval_s:.0f} s) is not shorter than the durable "
            f"one ({interval:.0f} s): local saves cost stalls and lower no RPO"
        )
    return PlanResult(
        hosts=hosts,
        bytes_per_param=bpp,
        size_bytes=size,
        size_per_host_bytes=per_host,
        delta_bytes=delta,
        write_s=write_s,
        snapshot_s=snapshot_s,
        load_s=load_s,
        restart_total_s=restart,
        job_mtbf_s=mtbf,
        modes=modes,
        recommended=chosen.mode,
        footprint=fp,
        cost_month_peak=fp.peak_bytes / GB * i.price_gb_month,
        cost_month_average=fp.average_bytes / GB * i.price_gb_month,
        cost_run=fp.average_bytes / GB * i.price_gb_month * (wall / MONTH_S),
        recovery=recovery,
        preempt_save_s=preempt_s,
        warnings=grace_warnings(preempt_s, i.grace_s) + local_notes,
        inputs=asdict(i),
    )


def restart_parts(i: PlanInputs) -> rec.RestartParts:
    """The restart cost besides loading, in parts: the given ones (defaults for the others),
    else `restart_s` split in the default proportions."""
    if (i.detect_s, i.reschedule_s, i.warmup_s) == (None, None, None):
        return rec.RestartParts.split(i.restart_s)
    return rec.RestartParts(
        rec.DEFAULT_DETECT_S if i.detect_s is None else i.detect_s,
        rec.DEFAULT_RESCHEDULE_S if i.reschedule_s is None else i.reschedule_s,
        rec.DEFAULT_WARMUP_S if i.warmup_s is None else i.warmup_s,
    )


def grace_warnings(preempt_save_s: float, grace_s: float | None) -> list[str]:
    """A warning when a preemption save (SIGTERM: every rank saves the step it reached) does not
    commit within the pod's grace period: Kubernetes SIGKILLs the pod and the work since the
    last periodic checkpoint is lost."""
    if grace_s is None or preempt_save_s <= grace_s:
        return []
    return [
        f"a preemption save takes about {preempt_save_s:.0f} s per host but pods get "
        f"{grace_s:.0f} s between SIGTERM and SIGKILL: raise terminationGracePeriodSeconds "
        f"(pretrain.grace_s) to at least {math.ceil(preempt_save_s * 1.2)} s, or write faster"
    ]

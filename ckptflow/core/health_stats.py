"""`ckptflow ckpt stats`: checkpoint health figures of a root, from its listing, its evaluation
records and its event log (ckptflow.core.health); torch-free.

- checkpoints per hour: committed steps over the span of their commit times;
- success rate: saves recorded ok / saves recorded (no events: committed / step folders);
- stall and save time: median and p95 of the recorded saves;
- stored bytes: unique referenced bytes of the hot root; new bytes by kind and by tier;
- compression: per mode the saves recorded (`auto:always` on object storage, billed by the
  byte; `auto:adaptive` elsewhere; `on`/`off` forced), steps and the logical bytes stored
  compressed;
- achieved RPO: the largest gap between the commit times of consecutive valid steps;
- commit-to-evaluated latency: eval record time less commit time, median and max;
- last verified step: the newest step a verify or drill read in full without fault;
- recoveries: loads that resumed training after a save; time to recover: from the training's
  last save or resume before the restart to the resumed load's end, an upper bound of
  detection + rescheduling + load (it includes the work lost since that save);
- each recovery measured (`recovery` events, ckptflow.core.liveness): from the failed
  training's last progress to the resumed training's first, with the steps lost; by restore
  source (local copy, peer replica, object storage: issue 35) and the bytes the restores
  read from object storage.
"""

from __future__ import annotations

import math
import time

from ckptflow.core import health, listing, runroot
from ckptflow.core.storage import Storage


def quantile(values: list[float], q: float) -> float | None:
    """The q-quantile (nearest rank) of `values`; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _bytes(rows: list[listing.StepRow]) -> dict:
    by_kind: dict[str, int] = {}
    by_tier: dict[str, int] = {}
    unique: dict[str, int] = {}
    compression: dict[str, dict[str, int]] = {}  # mode -> steps, logical, compressed bytes
    for r in rows:
        if r.state == "uncommitted":
            continue
        c = compression.setdefault(r.compression or "unrecorded", dict.fromkeys(_COMP, 0))
        c["steps"] += 1
        c["logical_bytes"] += r.logical_bytes
        c["compressed_bytes"] += r.compressed_bytes
        kind = (r.kind or "unknown") + (",slim" if r.slimmed_at is not None else "")
        by_kind[kind] = by_kind.get(kind, 0) + r.new_bytes
        by_tier[r.tier] = by_tier.get(r.tier, 0) + r.new_bytes
        if r.tier == "hot":
            unique.update(r.objects)
    return {
        "hot_unique": sum(unique.values()),
        "new_by_kind": by_kind,
        "new_by_tier": by_tier,
        "compression": compression,
    }


_COMP = ("steps", "logical_bytes", "compressed_bytes")


def _compression_text(by_mode: dict) -> str:
    """e.g. `auto:always 3 steps (100% of 1.5 GiB compressed)`, one per mode."""
    out = []
    for m, c in sorted(by_mode.items()):
        share = c["compressed_bytes"] / c["logical_bytes"] if c["logical_bytes"] else 0.0
        done = "" if m == "unrecorded" else f" ({100 * share:.0f}% of "
        done += f"{listing.human_bytes(c['logical_bytes'])} compressed)" if done else ""
        out.append(f"{m} {c['steps']} step{'s' * (c['steps'] != 1)}{done}")
    return ", ".join(out) or "-"


def _eval_latency(st: Storage, rows: list[listing.StepRow]) -> list[float]:
    out = []
    for r in rows:
        if not (r.valid and r.metrics and r.committed_at):
            continue
        try:
            rec = runroot.read_eval(st, r.step)
        except runroot.RecordError:
            continue
        if rec is not None and rec.evaluated_at is not None and rec.status == "ok":
            out.append(max(0.0, rec.evaluated_at - r.committed_at))
    return out


def _recoveries(events: list[health.Event]) -> list[float]:
    """Time to recover of each resume load: from the training's last recorded save or load
    before it (the failed run's last sign of life) to its end. Drills, verifies and gc runs
    are not the training's and do not count."""
    out, last = [], None
    for ev in events:
        if ev.kind == "load" and ev.resume and ev.outcome == "ok" and last is not None:
            out.append(max(0.0, ev.at - last))
        if ev.kind == "save" or (ev.kind == "load" and ev.resume):
            last = ev.at
    return out


def _measured(events: list[health.Event]) -> list[dict]:
    """Each recorded recovery, oldest first (ckptflow.core.liveness)."""
    return [
        {
            "at": ev.at,
            "recovery_s": ev.duration_s,
            "resumed_step": ev.step,
            "last_step": ev.last_step,
            "lost_steps": max(0, (ev.last_step or 0) - (ev.step or 0)),
            "source": ev.source,
            "store_bytes": ev.store_bytes,
        }
        for ev in events
        if ev.kind == "recovery" and ev.outcome == "ok"
    ]


def _by_source(measured: list[dict]) -> dict[str, int]:
    """Recoveries per restore source (issue 35); one without a recorded source in none."""
    out = dict.fromkeys(health.RESTORE_SOURCES, 0)
    for m in measured:
        if m["source"] in out:
            out[m["source"]] += 1
    return out


def stats(st: Storage, now: float | None = None) -> dict:
    """Every figure of the module doc, as a JSON-ready dict (None where nothing was recorded)."""
    now = time.time() if now is None else now
    rows = listing.build_rows(st, now=now, check=True)
    events, damaged = health.read_events(st)
    valid = sorted((r.committed_at or 0.0, r.step) for r in rows if r.valid)
    times = [t for t, _ in valid]
    span_h = (times[-1] - times[0]) / 3600 if len(times) > 1 else 0.0
    saves = [e for e in events if e.kind == "save"]
    ok = [e for e in saves if e.outcome == "ok"]
    folders = list(rows)
    success = len(ok) / len(saves) if saves else (len(valid) / len(folders) if folders else None)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    verified = [
        e.step for e in events if e.kind in ("verify", "drill") and e.outcome == "ok" and e.step
    ]
    latency = _eval_latency(st, rows)
    recover = _recoveries(events)
    measured = _measured(events)
    return {
        "root": st.uri,
        "steps": {
            "committed": len(valid),
            "corrupt": sum(r.state == "corrupt" for r in rows),
            "uncommitted": sum(r.state == "uncommitted" for r in rows),
            "slimmed": sum(r.slimmed_at is not None for r in rows),
            "first": valid[0][1] if valid else None,
            "last": valid[-1][1] if valid else None,
        },
        "checkpoints_per_hour": (len(times) - 1) / span_h if span_h else None,
        "saves": {"recorded": len(saves), "failed": len(saves) - len(ok), "success_rate": success},
        "stall_s": {
            "median": quantile([e.stall_s for e in ok], 0.5),
            "p95": quantile([e.stall_s for e in ok], 0.95),
        },
        "save_s": {
            "median": quantile([e.duration_s for e in ok], 0.5),
            "p95": quantile([e.duration_s for e in ok], 0.95),
        },
        "bytes": _bytes(rows),
        "achieved_rpo_s": max(gaps) if gaps else None,
        "since_last_commit_s": now - times[-1] if times else None,
        "commit_to_evaluated_s": {
            "median": quantile(latency, 0.5),
            "max": max(latency, default=None),
            "evaluated": len(latency),
        },
        "last_verified_step": max(verified, default=None),
        "recoveries": {
            "count": len(recover),
            "median_s": quantile(recover, 0.5),
            "max_s": max(recover, default=None),
            "measured": measured,
            "by_source": _by_source(measured),
            "store_bytes": sum(m["store_bytes"] for m in measured),
        },
        "events": {"read": len(events), "damaged": damaged},
    }


def duration(v: float | None) -> str:
    """A duration for the table: milliseconds under a second (a save's stall is often well
    under one: "0.00 s" said nothing), seconds under two minutes, then an age."""
    if v is None:
        return "-"
    if v < 1:
        ms = v * 1000
        digits = 0 if ms >= 100 else 1 if ms >= 10 else 2
        return "0 ms" if ms == 0 else f"{ms:.{digits}f} ms"
    return f"{v:.2f} s" if v < 120 else listing.human_age(v)


def _measured_rows(measured: list[dict]) -> list[tuple[str, str]]:
    """One row per measured recovery: its time, where it resumed and the steps lost."""
    return [
        (
            f"  recovery {i}",
            f"{duration(m['recovery_s'])} last progress to resumed progress (step "
            f"{m['last_step']} reached, resumed from {m['resumed_step']}: {m['lost_steps']} "
            "steps lost" + (f"; from {m['source']}" if m.get("source") else "") + ")",
        )
        for i, m in enumerate(measured, 1)
    ]


def _source_text(rec: dict) -> str:
    """e.g. `local 2, peer 1, store 1; 3.0 MiB from object storage`."""
    counts = ", ".join(f"{k} {v}" for k, v in rec["by_source"].items())
    return f"{counts}; {listing.human_bytes(rec['store_bytes'])} from object storage"


def render(s: dict) -> str:
    """The stats as an aligned two-column table."""
    h, sec = listing.human_bytes, duration

    steps, saves, b = s["steps"], s["saves"], s["bytes"]
    rate = saves["success_rate"]
    rows = [
        ("root", s["root"]),
        (
            "committed steps",
            f"{steps['committed']} ({steps['first']}..{steps['last']}), {steps['slimmed']} slim, {steps['corrupt']} corrupt, {steps['uncommitted']} uncommitted",
        ),
        (
            "checkpoints per hour",
            "-" if s["checkpoints_per_hour"] is None else f"{s['checkpoints_per_hour']:.2f}",
        ),
        (
            "save success rate",
            "-"
            if rate is None
            else f"{100 * rate:.1f} % ({saves['recorded']} recorded, {saves['failed']} failed)",
        ),
        ("stall median / p95", f"{sec(s['stall_s']['median'])} / {sec(s['stall_s']['p95'])}"),
        ("save time median / p95", f"{sec(s['save_s']['median'])} / {sec(s['save_s']['p95'])}"),
        ("stored (hot, unique)", h(b["hot_unique"])),
        ("compression", _compression_text(b.get("compression", {}))),
        (
            "new bytes by kind",
            ", ".join(f"{k} {h(v)}" for k, v in sorted(b["new_by_kind"].items())) or "-",
        ),
        (
            "new bytes by tier",
            ", ".join(f"{k} {h(v)}" for k, v in sorted(b["new_by_tier"].items())) or "-",
        ),
        ("achieved RPO (max gap)", sec(s["achieved_rpo_s"])),
        ("since last commit", sec(s["since_last_commit_s"])),
        (
            "commit to evaluated",
            f"median {sec(s['commit_to_evaluated_s']['median'])}, max {sec(s['commit_to_evaluated_s']['max'])} ({s['commit_to_evaluated_s']['evaluated']} evaluated)",
        ),
        (
            "last verified step",
            str(s["last_verified_step"] if s["last_verified_step"] is not None else "-"),
        ),
        (
            "recoveries",
            f"{s['recoveries']['count']} (time to recover median {sec(s['recoveries']['median_s'])}, max {sec(s['recoveries']['max_s'])})",
        ),
        ("recoveries by source", _source_text(s["recoveries"])),
        *_measured_rows(s["recoveries"]["measured"]),
        ("events", f"{s['events']['read']} read, {s['events']['damaged']} damaged"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

"""Verification drills (torch-free part): read every byte of the newest K committed steps and
mark any that fail corrupt for every reader (ckptflow.core.marks), recording each check in the
health log. The test-load of the latest into its model is ckptflow.steps.drill's.

A step already marked corrupt is not read again (it stays corrupt until someone removes the
marker by hand, after repairing it). Steps uncommitted or being deleted are skipped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ckptflow.core import health, layout, listing, marks, rootreader
from ckptflow.core.storage import Storage


@dataclass
class DrillReport:
    """What a drill checked and found."""

    root: str
    verified: list[int] = field(default_factory=list)  # read in full, sound
    corrupt: dict[int, list[str]] = field(default_factory=dict)  # step -> bad files
    already_marked: list[int] = field(default_factory=list)  # marked corrupt before
    bytes_read: int = 0

    @property
    def ok(self) -> bool:
        return not self.corrupt


def newest(st: Storage, k: int) -> list[int]:
    """The newest `k` committed steps, newest first."""
    return list(reversed(rootreader.committed_steps(st)))[: max(0, k)]


def verify_recorded(
    st: Storage, step: int, event: str, progress=None
) -> tuple[dict | None, list[str]]:
    """`listing.verify_step` of `step`, recorded in the health log as `event` (verify from
    `ckpt verify`, drill from a drill): one place for both, so their events agree."""
    t0 = time.time()
    m, bad = listing.verify_step(st, step, progress=progress)
    health.record(
        st,
        event,
        step=step,
        outcome="failed" if bad else "ok",
        duration_s=time.time() - t0,
        bytes=m["stats"]["stored_bytes"] if m else 0,
        error="; ".join(bad)[:400],
    )
    return m, bad


def verify_newest(st: Storage, k: int, *, mark: bool = True, by: str = "drill") -> DrillReport:
    """Verify the newest `k` committed steps in full; mark the bad ones corrupt (`mark`)."""
    report = DrillReport(st.uri)
    for step in newest(st, k):
        # decided by the marker itself, never by the wording of a verify message
        if marks.corrupt_reason(st, step, set(st.listdir(layout.step_dir(step)))) is not None:
            report.already_marked.append(step)
            continue
        m, bad = verify_recorded(st, step, "drill")
        report.bytes_read += m["stats"]["stored_bytes"] if m else 0
        if bad:
            report.corrupt[step] = bad
            if mark:
                fail(st, step, f"verify: {'; '.join(bad)[:1500]}", by)
        else:
            report.verified.append(step)
    return report


def fail(st: Storage, step: int, reason: str, by: str) -> bool:
    """Mark `step` corrupt for every reader (True when this call marked it)."""
    return marks.mark_corrupt(st, step, reason, by)

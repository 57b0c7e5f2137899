"""Garbage collection of a checkpoint root under a retention policy (docs/format.md "Deletion").

`gc(root, policy)` plans and, with `apply=True`, deletes:

* committed hot steps the policy does not keep: the COMMIT marker first (so a half-deleted step
  is never seen as valid), then the folder's other files;
* uncommitted leftovers of crashed saves whose newest file is older than the grace period; a
  folder with a younger file is a save in progress and is never touched;
* in kept steps, a losing racer's manifest and intent (not named by COMMIT), after the grace;
* objects that no kept manifest references and that are older than the grace. The committed
  steps are listed again right before objects are deleted, so a save that committed meanwhile
  keeps its objects; the manifest of a save between its manifest write and its commit protects
  its objects too. A save in progress is protected by its intent, whatever the grace: while
  its heartbeat is within its lease, its folder is left alone and no object written since it
  started is deleted (ckptflow.core.intent).

Every deletion ignores files already gone, so a crash mid-GC leaves only things a later `gc`
removes: a step without COMMIT is an uncommitted leftover, an unreferenced object is garbage.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass, field

from ckptflow.core import health, intent, layout, listing, rootreader, runroot
from ckptflow.core.errors import CheckpointError
from ckptflow.core.gc_objects import delete_files, free_objects
from ckptflow.core.policy_syntax import parse_duration
from ckptflow.core.retention import Policy, RetentionPlan, check_applies, plan_retention
from ckptflow.core.storage import Storage, is_temporary

DEFAULT_GRACE_S = 3600.0


@dataclass
class GcReport:
    """What a GC run would delete (dry run) or deleted (applied), and the bytes freed."""

    root: str  # the checkpoint root
    policy: str  # the policy, in its string form
    applied: bool  # False: a dry run, nothing was deleted
    keep: dict[int, list[str]] = field(default_factory=dict)  # kept hot step -> reasons
    delete_steps: list[int] = field(default_factory=list)  # committed steps deleted
    leftovers: list[int] = field(default_factory=list)  # uncommitted folders removed
    in_progress: list[int] = field(default_factory=list)  # uncommitted folders left alone
    orphan_files: list[str] = field(default_factory=list)  # racers' files in kept steps
    objects: list[str] = field(default_factory=list)  # object keys freed
    slimmed: dict[int, int] = field(default_factory=dict)  # slim=AGE: step -> bytes it drops
    bytes_freed: int = 0  # objects plus step files
    warnings: list[str] = field(default_factory=list)
    grace_s: float = 0.0  # the grace period
    grace_objects: int = 0  # unreferenced objects kept because they are younger than it
    grace_bytes: int = 0  # their bytes

    def as_dict(self) -> dict:
        d = asdict(self)
        d["keep"] = {str(k): v for k, v in self.keep.items()}
        d["slimmed"] = {str(k): v for k, v in self.slimmed.items()}
        return d

    def lines(self) -> list[str]:
        """The report for a person: what goes, what stays and why, and the bytes freed."""
        verb = "deleted" if self.applied else "would delete"
        out = [f"gc {self.root}  policy {self.policy}"]
        out += [f"  keep   step {s:>10}  ({', '.join(r)})" for s, r in sorted(self.keep.items())]
        out += [f"  {verb} step {s:>10}" for s in self.delete_steps]
        out += [f"  {verb} uncommitted leftover step {s}" for s in self.leftovers]
        out += [f"  left alone: save in progress at step {s}" for s in self.in_progress]
        out += [f"  {verb} orphan file {f}" for f in self.orphan_files]
        slim_verb = "slimmed" if self.applied else "would slim"
        out += [f"  {slim_verb} step {s} (weights only)" for s in sorted(self.slimmed)]
        out += [f"  warning: {w}" for w in self.warnings]
        out.append(
            f"{verb} {len(self.delete_steps)} step(s), {len(self.leftovers)} leftover(s), "
            f"{len(self.objects)} object(s): {listing.human_bytes(self.bytes_freed)} freed"
        )
        if self.grace_objects:
            out.append(
                f"kept by the {_age(self.grace_s)} grace period: {self.grace_objects} unreferenced "
                f"object(s), {listing.human_bytes(self.grace_bytes)} (written less than "
                f"{_age(self.grace_s)} ago; --grace 0 frees them: a live save is protected by "
                "its intent)"
            )
        if not self.applied:
            out.append("dry run: nothing was deleted; add --yes to delete")
        return out


def parse_policy(spec: str) -> Policy:
    """A policy string; a bare thinning spec (`2h:all,1d:1h,7d:1d,*:7d`, no `=`) means thin=."""
    if "=" not in spec and ":" in spec:
        return Policy(thinning=spec)
    return Policy.parse(spec)


def gc(
    root_uri: str,
    policy: Policy | str,
    *,
    apply: bool = False,
    grace_s: float = DEFAULT_GRACE_S,
    now: float | None = None,
    storage: Storage | None = None,
) -> GcReport:
    """Collect a checkpoint root under `policy` (dry run unless `apply`); see the module doc."""
    started = time.monotonic()  # the run's duration: `now` may be a given clock, not this one
    now = time.time() if now is None else now
    grace_s = check_grace(grace_s)
    policy = parse_policy(policy) if isinstance(policy, str) else policy
    st = listing.open_root(root_uri, storage, must_exist=False)
    rootreader.require_marker(st)  # never delete on a guessed root id (all steps "foreign")
    report = GcReport(root=st.uri, policy=policy.to_spec(), applied=apply, grace_s=grace_s)
    rows = listing.build_rows(st, now=now, check=True)
    check_applies(policy, listing.entries(rows))  # before anything is planned or deleted
    plan = plan_on_sound_latest(st, rows, policy, now, report.warnings)
    report.keep, report.delete_steps = dict(plan.reasons), list(plan.delete)
    report.warnings += plan.warnings
    by_step = {r.step: r for r in rows}
    doomed: list[tuple[int, list]] = []
    for step in plan.delete:
        doomed.append((step, listing.step_files(st, step)))
    doomed += _leftovers(st, rows, now, grace_s, report)
    orphans = _orphans(st, [by_step[s] for s in plan.keep], now - grace_s)
    report.orphan_files = [st.url(e.path) for e in orphans]
    report.bytes_freed = sum(e.size for _, files in doomed for e in files)
    report.bytes_freed += sum(e.size for e in orphans)
    if apply:
        for step, files in doomed:
            if step in report.delete_steps and runroot.pinned(st, step):
                report.delete_steps.remove(step)  # pinned while this gc ran: pins always win
                report.bytes_freed -= sum(e.size for e in files)
                report.warnings.append(f"step {step} was pinned during gc; kept")
                continue
            _delete_step(st, step, files)
        delete_files(st, [e.path for e in orphans])
    if policy.slim is not None:
        kept = [by_step[s] for s in plan.keep]
        report.slimmed = _slim_kept(st, kept, policy, now, apply, report.warnings)
    young: list[int] = []
    keys, size = free_objects(
        st, rows, set(plan.delete), now - grace_s, report.warnings, apply, now=now, young=young
    )
    report.objects, report.bytes_freed = keys, report.bytes_freed + size
    report.grace_objects, report.grace_bytes = len(young), sum(young)
    if apply:
        health.prune(st)
        health.record(st, "gc", duration_s=time.monotonic() - started, bytes=report.bytes_freed)
    return report


def _slim_kept(
    st: Storage,
    kept: list[listing.StepRow],
    policy: Policy,
    now: float,
    apply: bool,
    warnings: list[str],
) -> dict[int, int]:
    """The policy's `slim=AGE`: kept hot steps older than AGE become weights only (see
    ckptflow.core.slim for what is never slimmed); their rows then name only what they keep,
    so this same gc frees the rest once the slim is older than the grace."""
    from ckptflow.core import slim

    todo, _ = slim.candidates(kept, parse_duration(policy.slim))
    out = {}
    for step in todo:
        try:
            if apply:
                new = slim.slim_step(st, step, slim.DEFAULT_KEEP, now)
            else:
                m = rootreader.read_manifest(st, step)
                new = slim.slim_manifest(m, slim.DEFAULT_KEEP, "0" * 16, "0" * 16, now)
        except CheckpointError as exc:  # (a corrupt step, or one without `model.` tensors)
            warnings.append(f"step {step} not slimmed: {exc}")
            continue
        if new is None:
            continue
        out[step] = new["slimmed"]["dropped_bytes"]
        row = next(r for r in kept if r.step == step)
        row.objects = {k: v["size"] for k, v in new["objects"].items()}
        row.slimmed_at, row.manifest_id = now, new["slimmed"]["slim_id"]
    return out


def _age(seconds: float) -> str:
    """1h, 90s, 2d: a grace period as a person writes it."""
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= n and seconds % n == 0:
            return f"{int(seconds // n)}{unit}"
    return f"{seconds:g}s"


def check_grace(grace_s: float) -> float:
    """A grace period must be a number of seconds, 0 or more. 0 is safe: a live save is
    protected by its intent's heartbeat (ckptflow.core.intent), not by the grace period."""
    if isinstance(grace_s, bool) or not isinstance(grace_s, int | float) or not grace_s >= 0:
        raise CheckpointError(f"grace period {grace_s!r}: give 0 or more seconds (e.g. 3600)")
    if not math.isfinite(grace_s):
        raise CheckpointError(f"grace period {grace_s!r}: give a finite number of seconds")
    return float(grace_s)


def _leftovers(st: Storage, rows: list, now: float, grace_s: float, report: GcReport) -> list:
    """(step, files) to delete of uncommitted folders: crashed saves. A folder whose intent is
    live (heartbeat within its lease) or that changed within the grace is left alone."""
    doomed = []
    for row in rows:
        if row.state != "uncommitted":
            continue
        young = row.age_s is not None and row.age_s < grace_s
        if young or intent.live_starts(st, row.step, now, row.files):
            report.in_progress.append(row.step)
            continue
        report.leftovers.append(row.step)
        # Only old files of the row's listing: a new save of the same step may have started
        # since (its files are not in that listing, and are young).
        files = [e for e in row.files if e.mtime < now - grace_s]
        doomed.append((row.step, files))
    return doomed


def plan_on_sound_latest(
    st: Storage, rows: list[listing.StepRow], policy: Policy, now: float, warnings: list[str]
) -> RetentionPlan:
    """The retention plan, once the latest valid step it keeps has passed a content check.

    Rows are checked cheaply (existence and size), which a flipped byte passes. Before older
    valid steps are deleted, the step that recovery would then rely on is read in full and
    every object's checksum checked (a deep verify of that one step); a step that fails is
    marked corrupt and the plan made again, so the next older sound step is kept instead."""
    by_step = {r.step: r for r in rows}
    while True:
        plan = plan_retention(listing.entries(rows), policy, now)
        latest = next((s for s, why in plan.reasons.items() if "latest-valid" in why), None)
        older = [s for s in plan.delete if latest is not None and s < latest]
        if latest is None or not any(by_step[s].valid for s in older):
            return plan  # nothing that recovery could fall back to is deleted
        _, bad = listing.verify_step(st, latest)
        if not bad:
            return plan
        row = by_step[latest]
        row.state, row.problems = "corrupt", bad
        warnings.append(
            f"step {latest} failed its content check and is treated as corrupt: "
            + "; ".join(bad[:3])
            + (f" (+{len(bad) - 3} more)" if len(bad) > 3 else "")
        )


def _orphans(st: Storage, kept: list[listing.StepRow], cutoff: float) -> list:
    """Manifests and intents in committed steps that COMMIT does not name (a losing racer),
    and temporary files of atomic writes a crash left behind."""
    out = []
    for row in kept:
        if row.save_id is None:
            continue
        for e in listing.step_files(st, row.step):
            name = e.path.rsplit("/", 1)[-1]
            if is_temporary(name) and e.mtime < cutoff:
                out.append(e)
                continue
            stem = name.removesuffix(".json")
            # a slimmed step's original manifest goes once the slim is older than the grace
            live = {f"manifest-{row.manifest_id or row.save_id}", f"saving-{row.save_id}"}
            if row.slimmed_at is not None and row.slimmed_at > cutoff:
                live.add(f"manifest-{row.save_id}")
            own = layout.RANK_MANIFEST_RE.match(name)
            if own:  # a format-5 save's rank manifests live and go with its step index
                stem = f"manifest-{own.group(1)}"
            if (
                name.endswith(".json")
                and stem.startswith(("manifest-", "saving-"))
                and stem not in live
                and e.mtime < cutoff
            ):
                out.append(e)
    return out


def _delete_step(st: Storage, step: int, files: list) -> None:
    """COMMIT first (the step stops being valid), then the rest of the files that were listed."""
    sd = layout.step_dir(step)
    commit = f"{sd}/{layout.COMMIT}"
    rels = [e.path for e in files]
    if commit in rels:
        st.delete([commit])
    delete_files(st, [r for r in rels if r != commit])
    if st.protocol == "file":  # local folders do not vanish with their last file
        with contextlib.suppress(OSError):
            st.fs.rmdir(st.path(sd))

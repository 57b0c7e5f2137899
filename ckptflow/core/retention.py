"""Retention policies: which checkpoints of a catalog to keep and which to delete.

Pure Python (no torch), so the CLI, the planner and the workflows can all use it.

Semantics
---------
A policy is a set of rules; a checkpoint is kept when ANY rule keeps it. Rules look only at
valid entries (committed and not known to be corrupt); an invalid entry is kept only when it is
pinned or is the base of a kept delta, so GC removes corrupt checkpoints by default.

- ``KeepLast(n)``: the n valid checkpoints with the highest steps. Reason ``last-N``.
- ``Thinning(spec)``: a spec ``AGE:EVERY`` tiers, e.g. ``2h:all,1d:1h,7d:1d,*:7d``. A checkpoint
  of age ``a = now - committed_at`` falls in the first tier whose AGE is greater than ``a``
  (``*`` = no limit; the tiers cover ``[0, 2h)``, ``[2h, 1d)``, ``[1d, 7d)``, ``[7d, inf)``; an
  entry dated in the future counts as age 0). ``EVERY=all`` keeps all of its tier. Otherwise
  time is cut into buckets of EVERY seconds aligned to the Unix epoch (hours on the hour, days
  at 00:00 UTC, 7-day buckets on Thursdays 00:00 UTC), and the tier keeps the newest valid
  checkpoint (by ``committed_at``, then step) of each bucket among the entries in that tier.
  Buckets are aligned to the epoch, not to ``now``: with buckets that moved with ``now`` two
  survivors would keep falling into one bucket and the spacing would drift to twice EVERY. With
  fixed buckets the only churn is at a tier boundary: while a bucket straddles it, its newest
  entry on the older side changes as entries cross over, and the previous one goes. Deletions
  are final, so with GC after every save a bucket's representative is its newest survivor.
  With EVERY values that divide each other (1h, 1d, 7d) the newest entry of a coarse bucket is
  the newest of its last fine bucket, so every coarse bucket that ever held a valid checkpoint
  keeps one. Entries older than the last AGE (when it is not ``*``) are not kept by thinning. Reason ``thin:EVERY`` (as written, e.g. ``thin:1h``, ``thin:all``).
- ``KeepBest(metric, k, mode)``: the k valid entries with the lowest (``min``) or highest
  (``max``) value of a metric; entries without it (or with NaN) do not compete; ties go to the
  later step. Reason ``best:METRIC``.
- ``KeepKind(kind, age)``: every valid entry of that kind (``full`` or ``delta``) younger than
  AGE, e.g. ``delta=7d,full=30d`` keeps incrementals a week and fulls a month. Reason
  ``kind:delta<7d``.
- ``slim=AGE`` is no keep rule: GC demotes kept hot steps older than AGE to weights only
  (ckptflow.core.slim) before it frees objects.
- Always: pinned entries (``pinned``), the valid entry with the highest step (``latest-valid``),
  and, transitively, the base of every kept delta (``base-of:STEP``).
- A rule naming a metric or kind no valid entry has is refused by gc (`check_applies`): it
  would keep nothing, and a typo would delete what it meant to keep.
- When no entry is valid at all, nothing is deleted (reason ``no-valid-step``, with a warning):
  all steps failing at once says the catalog cannot be read (a lost root marker), and deleting
  them would leave nothing to recover from.

Archive entries take part in the rules (a bucket whose newest checkpoint is archived needs no
hot one as well) but are never in ``keep``/``delete``, which list hot steps only; the hot base
of an archived delta is kept. Duration units: s, m, h, d, w.

Policy string (CLI and workflows), items separated by commas:
``last=N``, ``thin=AGE:EVERY/AGE:EVERY/...`` (``/`` or ``,`` between tiers), and
``best=METRIC:MODE:K`` (repeatable), ``full=AGE``, ``delta=AGE`` and ``slim=AGE``, e.g. ``last=5,thin=2h:all/1d:1h/7d:1d/*:7d,best=val_loss:min:3``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from ckptflow.core.policy_syntax import PolicyError, Tier, _parse_tiers, parse_duration

_WHOLE = re.compile(r"[0-9]{1,9}")  # ASCII digits only: str.isdigit takes "²", int() does not
POLICY_EXAMPLE = "last=5,thin=2h:all/1d:1h/7d:1d/*:7d,best=val_loss:min:3"


@dataclass(frozen=True)
class CatalogEntry:
    """One checkpoint as the catalog knows it."""

    step: int  # training step (unique within a catalog)
    committed_at: float  # commit time, Unix epoch seconds
    kind: str = "full"  # "full" or "delta" (any kind with a base_step depends on it)
    base_step: int | None = None  # the step this one needs to load (deltas)
    pinned: bool = False  # published: never deleted by a policy
    metrics: dict[str, float] = field(default_factory=dict)  # evaluation metrics, by name
    tier: str = "hot"  # "hot" (GC candidates) or "archive" (handled separately)
    valid: bool = True  # committed and not known to be corrupt

    def __post_init__(self) -> None:
        if self.tier not in ("hot", "archive"):
            raise ValueError(
                f"step {self.step}: tier must be 'hot' or 'archive', not {self.tier!r}"
            )


@dataclass(frozen=True)
class KeepLast:
    """Keep the n valid checkpoints with the highest steps."""

    n: int

    def __post_init__(self) -> None:
        if self.n < 0:
            raise PolicyError(f"last={self.n}: the number to keep must be 0 or more")

    def select(self, entries: Iterable[CatalogEntry], now: float) -> dict[int, str]:
        steps = sorted(e.step for e in entries if e.valid)
        return {s: f"last-{self.n}" for s in (steps[-self.n :] if self.n else [])}


@dataclass(frozen=True)
class Thinning:
    """Exponential thinning: all recent checkpoints, fewer and fewer as they age (see module doc)."""

    spec: str
    tiers: tuple[Tier, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tiers", _parse_tiers(self.spec))

    def canonical(self) -> str:
        """The spec with '/' between tiers (the form that fits inside a policy string)."""
        return "/".join(f"{t.age_label}:{t.every_label}" for t in self.tiers)

    def tier_index(self, age: float) -> int | None:
        """Index of the tier an entry of this age falls in, or None beyond the last tier."""
        for i, tier in enumerate(self.tiers):
            if max(age, 0.0) < tier.max_age:
                return i
        return None

    def select(self, entries: Iterable[CatalogEntry], now: float) -> dict[int, str]:
        kept: dict[int, str] = {}
        newest: dict[tuple[int, int], CatalogEntry] = {}
        for e in entries:
            i = self.tier_index(now - e.committed_at) if e.valid else None
            if i is None:
                continue
            tier = self.tiers[i]
            if tier.every is None:
                kept[e.step] = f"thin:{tier.every_label}"
                continue
            key = (i, math.floor(e.committed_at / tier.every))
            cur = newest.get(key)
            if cur is None or (e.committed_at, e.step) > (cur.committed_at, cur.step):
                newest[key] = e
        for (i, _), e in newest.items():
            kept[e.step] = f"thin:{self.tiers[i].every_label}"
        return kept


@dataclass(frozen=True)
class KeepBest:
    """Keep the k valid checkpoints with the best value of an evaluation metric."""

    metric: str
    k: int
    mode: str = "min"

    def __post_init__(self) -> None:
        if self.mode not in ("min", "max"):
            raise PolicyError(f"best={self.metric}: mode must be 'min' or 'max', not {self.mode!r}")
        if self.k < 1:
            raise PolicyError(f"best={self.metric}: the number to keep must be 1 or more")
        if not self.metric or any(c in self.metric for c in ",="):
            raise PolicyError(
                f"bad metric name {self.metric!r}: it must be non-empty, without , or ="
            )

    def select(self, entries: Iterable[CatalogEntry], now: float) -> dict[int, str]:
        sign = 1.0 if self.mode == "min" else -1.0
        scored = [
            (sign * float(e.metrics[self.metric]), -e.step)
            for e in entries
            if e.valid
            and self.metric in e.metrics
            and not math.isnan(float(e.metrics[self.metric]))
        ]
        return {-neg_step: f"best:{self.metric}" for _, neg_step in sorted(scored)[: self.k]}


@dataclass(frozen=True)
class KeepKind:
    """Keep every valid checkpoint of one kind younger than an age."""

    kind: str  # "full" or "delta" (a deduplicated full step is a full one)
    age: str  # as written, e.g. "7d"

    def __post_init__(self) -> None:
        if self.kind not in ("full", "delta"):
            raise PolicyError(f"{self.kind}=: per-kind rules are full= and delta=")
        parse_duration(self.age)

    def select(self, entries: Iterable[CatalogEntry], now: float) -> dict[int, str]:
        limit = parse_duration(self.age)
        return {
            e.step: f"kind:{self.kind}<{self.age}"
            for e in entries
            if e.valid and e.kind == self.kind and now - e.committed_at < limit
        }


@dataclass(frozen=True)
class Policy:
    """A composed retention policy; pinned, latest-valid and needed bases are always kept."""

    keep_last: int = 0  # KeepLast(n); 0 = rule off
    thinning: str | None = None  # a Thinning spec, e.g. "2h:all,1d:1h,7d:1d,*:7d"
    keep_best: tuple[tuple[str, str, int], ...] = ()  # (metric, "min"|"max", k) per KeepBest rule
    keep_full: str | None = None  # KeepKind("full", AGE): every full step younger than AGE
    keep_delta: str | None = None  # KeepKind("delta", AGE): every delta younger than AGE
    slim: str | None = None  # GC slims kept hot steps older than AGE (not a keep rule)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keep_best", tuple(tuple(b) for b in self.keep_best))
        if self.slim is not None:
            parse_duration(self.slim)
        self.rules()  # validate now, so a bad policy fails where it is written

    def rules(self) -> list[KeepLast | Thinning | KeepBest | KeepKind]:
        """The rules this policy composes (a checkpoint is kept when any of them keeps it)."""
        rules: list[KeepLast | Thinning | KeepBest | KeepKind] = []
        for kind, age in (("full", self.keep_full), ("delta", self.keep_delta)):
            if age is not None:
                rules.append(KeepKind(kind, age))
        if self.keep_last:
            rules.append(KeepLast(self.keep_last))
        if self.thinning:
            rules.append(Thinning(self.thinning))
        for item in self.keep_best:
            if len(item) != 3:
                raise PolicyError(f"keep_best item {item!r} must be (metric, 'min'|'max', k)")
            metric, mode, k = item
            rules.append(KeepBest(metric, int(k), mode))
        return rules

    @classmethod
    def parse(cls, spec: str) -> Policy:
        """A policy from its string form (see the module docstring for the syntax)."""
        items: list[list[str]] = []
        for token in (t.strip() for t in spec.split(",")):
            if "=" in token:
                key, _, value = token.partition("=")
                items.append([key.strip().lower(), value.strip()])
            elif token and items and items[-1][0] in ("thin", "thinning"):
                items[-1][1] += "/" + token  # 'thin=2h:all,1d:1h' written with commas
            elif token:
                raise PolicyError(
                    f"policy item {token!r} has no '=': write e.g. {POLICY_EXAMPLE!r}"
                )
        if not items:
            raise PolicyError(f"empty retention policy: write e.g. {POLICY_EXAMPLE!r}")
        return cls(**_policy_kwargs(items))

    def to_spec(self) -> str:
        """The string form, which `Policy.parse` reads back to an equal policy."""
        parts = [f"last={self.keep_last}"] if self.keep_last else []
        if self.thinning:
            parts.append(f"thin={Thinning(self.thinning).canonical()}")
        parts += [f"best={m}:{mode}:{k}" for m, mode, k in self.keep_best]
        parts += [f"full={self.keep_full}"] if self.keep_full else []
        parts += [f"delta={self.keep_delta}"] if self.keep_delta else []
        parts += [f"slim={self.slim}"] if self.slim else []
        return ",".join(parts) or "last=0"

    def __str__(self) -> str:
        return self.to_spec()


def _policy_kwargs(items: list[list[str]]) -> dict:
    kwargs: dict = {"keep_best": []}
    for key, value in items:
        if key == "last":
            if "keep_last" in kwargs or not _WHOLE.fullmatch(value):
                raise PolicyError(f"last={value!r}: give one whole number, e.g. last=5")
            kwargs["keep_last"] = int(value)
        elif key in ("thin", "thinning"):
            if "thinning" in kwargs:
                raise PolicyError("thin= given twice: put all tiers in one, e.g. thin=2h:all/1d:1h")
            kwargs["thinning"] = Thinning(value).canonical()
        elif key == "best":
            metric, mode, k = (value.rsplit(":", 2) + ["", ""])[:3]
            if not _WHOLE.fullmatch(k):
                raise PolicyError(f"best={value!r}: write METRIC:MODE:K, e.g. best=val_loss:min:3")
            kwargs["keep_best"].append((metric, mode, int(k)))
        elif key in ("full", "delta", "slim"):
            name = {"full": "keep_full", "delta": "keep_delta", "slim": "slim"}[key]
            if name in kwargs:
                raise PolicyError(f"{key}= given twice: give one age, e.g. {key}=7d")
            parse_duration(value)
            kwargs[name] = value.strip().lower()
        else:
            raise PolicyError(f"unknown policy item {key!r}: use last=, thin=, best=, full=, …")
    return kwargs


@dataclass(frozen=True)
class RetentionPlan:
    """What GC should do with the hot checkpoints: keep (with reasons) or delete."""

    keep: list[int]  # hot steps kept, ascending
    delete: list[int]  # hot steps to delete, ascending
    reasons: dict[int, list[str]]  # why each kept step is kept
    warnings: list[str] = field(default_factory=list)  # e.g. a delta whose base is missing


def _unique(entries: Iterable[CatalogEntry]) -> dict[int, CatalogEntry]:
    """Entries by step; when a step is listed twice (an archive copy whose hot copy was not yet
    deleted) the hot entry wins, so that copy is planned rather than silently ignored."""
    by_step: dict[int, CatalogEntry] = {}
    for e in entries:
        if e.step not in by_step or (e.tier == "hot" and by_step[e.step].tier != "hot"):
            by_step[e.step] = e
    return by_step


def _latest_valid(by_step: dict[int, CatalogEntry]) -> int | None:
    return max((s for s, e in by_step.items() if e.valid), default=None)


def _keep_bases(by_step: dict[int, CatalogEntry], reasons: dict[int, list[str]]) -> list[str]:
    """Add every base that a kept or archived entry needs, transitively; return warnings."""
    warnings: list[str] = []
    stack = sorted(set(reasons) | {s for s, e in by_step.items() if e.tier == "archive"})
    seen: set[int] = set()
    while stack:
        step = stack.pop()
        base = by_step[step].base_step
        if step in seen or base is None or base == step:
            continue
        seen.add(step)
        if base not in by_step:
            warnings.append(f"step {step} needs base step {base}, which is not in the catalog")
            continue
        _add(reasons, base, f"base-of:{step}")
        stack.append(base)
    return warnings


def _add(reasons: dict[int, list[str]], step: int, why: str) -> None:
    bucket = reasons.setdefault(step, [])
    if why not in bucket:
        bucket.append(why)


def check_applies(policy: Policy, entries: Iterable[CatalogEntry]) -> None:
    """PolicyError when a rule names a metric or a kind that no valid checkpoint has: such a
    rule keeps nothing, and a typo (`best=acc` for `best=exact_match`) would let gc delete
    what the user meant to keep. A catalog with no valid entry yet is not judged (a run that
    saved nothing: gc deletes nothing there anyway)."""
    valid = [e for e in entries if e.valid]
    if not valid:
        return
    have = sorted({m for e in valid for m in e.metrics})
    for metric, mode, k in policy.keep_best:
        if metric not in have:
            raise PolicyError(
                f"best={metric}:{mode}:{k}: no checkpoint has metric {metric!r} (they have: "
                f"{', '.join(have) or 'no metrics'}); fix the metric name, or evaluate first"
            )
    kinds = {e.kind for e in valid}
    for kind, age in (("full", policy.keep_full), ("delta", policy.keep_delta)):
        if age is not None and kind not in kinds:
            raise PolicyError(
                f"{kind}={age}: no checkpoint is a {kind} (they are: {', '.join(sorted(kinds))}); "
                f"drop {kind}= from the policy"
            )


def plan_retention(
    entries: Iterable[CatalogEntry], policy: Policy | str, now: float
) -> RetentionPlan:
    """Split the hot steps of a catalog into keep and delete under a policy at time `now`.

    Invariants: the latest valid checkpoint, pinned ones and the bases (transitively) of kept
    or archived deltas are never deleted; archive entries are in neither list.
    """
    if isinstance(policy, str):
        policy = Policy.parse(policy)
    by_step = _unique(entries)
    valid = [e for e in by_step.values() if e.valid]
    reasons: dict[int, list[str]] = {}
    for rule in policy.rules():
        for step, why in sorted(rule.select(valid, now).items()):
            _add(reasons, step, why)
    for step in sorted(s for s, e in by_step.items() if e.pinned):
        _add(reasons, step, "pinned")
    latest = _latest_valid(by_step)
    if latest is not None:
        _add(reasons, latest, "latest-valid")
    else:
        return _keep_all(by_step)
    warnings = _keep_bases(by_step, reasons)
    hot = sorted(s for s, e in by_step.items() if e.tier == "hot")
    keep = [s for s in hot if s in reasons]
    delete = [s for s in hot if s not in reasons]
    return RetentionPlan(keep, delete, {s: reasons[s] for s in keep}, warnings)


def _keep_all(by_step: dict[int, CatalogEntry]) -> RetentionPlan:
    """No entry is valid: that says more about the catalog (a lost root marker makes every
    manifest look foreign at once) than about the steps, and deleting them all would leave
    nothing to recover from. Every hot step is kept, with a warning."""
    hot = sorted(s for s, e in by_step.items() if e.tier == "hot")
    warnings = []
    if hot:
        warnings.append(
            f"no step is valid ({len(hot)} hot step(s), all corrupt): nothing deleted; check "
            "the root (`ckptflow ckpt verify`) and delete what is beyond repair by hand"
        )
    return RetentionPlan(hot, [], {s: ["no-valid-step"] for s in hot}, warnings)


def select_for_archive(
    entries: Iterable[CatalogEntry], older_than_s: float, now: float
) -> list[int]:
    """Hot steps to move to the archive tier: valid, older than `older_than_s`, not the latest
    valid one, and not the base (transitively) of a hot delta that stays hot.

    A delta and its base are selected together when both are old enough, so the archive copy
    is loadable on its own (copy bases first). Pinned checkpoints may be archived: archiving is
    not deletion. Invalid entries are never archived (GC removes them).
    """
    by_step = _unique(entries)
    latest = _latest_valid(by_step)
    chosen = {
        s
        for s, e in by_step.items()
        if e.tier == "hot" and e.valid and s != latest and now - e.committed_at > older_than_s
    }
    while True:  # dropping a candidate may make its own base needed by a staying delta
        staying = (e for s, e in by_step.items() if e.tier == "hot" and s not in chosen)
        needed = chosen & {e.base_step for e in staying if e.base_step is not None}
        if not needed:
            return sorted(chosen)
        chosen -= needed

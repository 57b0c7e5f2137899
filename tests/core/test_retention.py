"""Retention policies on synthetic catalogs: timestamps injected, nothing sleeps."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptflow.core.policy_syntax import parse_duration
from ckptflow.core.retention import (
    CatalogEntry,
    KeepBest,
    KeepLast,
    Policy,
    PolicyError,
    Thinning,
    plan_retention,
    select_for_archive,
)

M, H, D = 60, 3600, 86400
NOW = 10 * D  # a UTC midnight, so hour and day buckets are easy to count by hand


def hourly(n: int, **kw) -> list[CatalogEntry]:
    """Steps 0..n-1, step i committed at i hours."""
    return [CatalogEntry(i, i * H, **kw) for i in range(n)]


@pytest.mark.parametrize(
    "module", ["retention", "policy_syntax", "planner", "footprint", "recovery"]
)
def test_pure_python_modules_import_no_torch(module):
    # static check: the package __init__ (not ours) may import torch, these modules must not
    path = Path(__file__).parents[2] / "ckptflow" / "core" / f"{module}.py"
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert not {m for m in imported if m.split(".")[0] in ("torch", "numpy", "fsspec")}
    assert {m for m in imported if m.startswith("ckptflow")} <= {
        "ckptflow.core.retention",
        "ckptflow.core.policy_syntax",
        "ckptflow.core.planner",
        "ckptflow.core.footprint",
        "ckptflow.core.recovery",
    }


# ---------------------------------------------------------------- durations and parsing


def test_parse_duration_units():
    assert parse_duration("90s") == 90
    assert parse_duration("30m") == 1800
    assert parse_duration("2h") == 7200
    assert parse_duration("1.5d") == 129600
    assert parse_duration("1w") == 604800
    for bad in ("", "5", "h", "-1h", "0h", "3y", "1 h 2m"):
        with pytest.raises(PolicyError, match="unit s, m, h, d or w"):
            parse_duration(bad)


def test_thinning_spec_parses_tiers():
    t = Thinning("2h:all,1d:1h,7d:1d,*:7d")
    assert [(x.max_age, x.every) for x in t.tiers] == [
        (2 * H, None),
        (D, H),
        (7 * D, D),
        (math.inf, 7 * D),
    ]
    assert t.canonical() == "2h:all/1d:1h/7d:1d/*:7d"
    assert Thinning("2h:all/1d:1h").tiers == Thinning(" 2h:ALL , 1d:1h ").tiers


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty thinning spec"),
        ("2h", "must be AGE:EVERY"),
        ("*:1d,30d:1d", "'\\*' tier must be last"),
        ("1d:1h,2h:all", "increasing ages"),
        ("1d:1h,1d:1d", "increasing ages"),
        ("1d:1x", "bad duration"),
    ],
)
def test_thinning_spec_errors_name_the_fix(spec, message):
    with pytest.raises(PolicyError, match=message):
        Thinning(spec)


def test_policy_string_round_trips_and_matches_python_api():
    text = "last=5,thin=2h:all/1d:1h/7d:1d/*:7d,best=val_loss:min:3,best=acc:max:1"
    p = Policy.parse(text)
    assert p == Policy(
        keep_last=5,
        thinning="2h:all/1d:1h/7d:1d/*:7d",
        keep_best=[("val_loss", "min", 3), ("acc", "max", 1)],
    )
    assert str(p) == text
    assert Policy.parse(str(p)) == p
    # the comma form of the thinning spec works inside a policy string too
    assert Policy.parse("thin=2h:all,1d:1h,7d:1d,*:7d,last=5").thinning == p.thinning
    assert Policy.parse("last=3").to_spec() == "last=3"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty retention policy"),
        ("5", "has no '='"),
        ("last=x", "whole number"),
        ("last=2,last=3", "whole number"),
        ("keep=3", "unknown policy item"),
        ("best=val_loss:3", "METRIC:MODE:K"),
        ("best=val_loss:median:3", "'min' or 'max'"),
        ("best=val_loss:min:0", "1 or more"),
        ("thin=1d:1h,thin=2d:1d", "given twice"),
    ],
)
def test_policy_errors_name_the_fix(spec, message):
    with pytest.raises(PolicyError, match=message):
        Policy.parse(spec)


def test_plan_accepts_a_policy_string():
    entries = hourly(10)
    assert plan_retention(entries, "last=2", NOW) == plan_retention(entries, Policy(2), NOW)


# ---------------------------------------------------------------- each rule, by hand


def test_keep_last_skips_invalid_entries():
    entries = hourly(9) + [CatalogEntry(9, 9 * H, valid=False)]
    assert KeepLast(3).select(entries, NOW) == {6: "last-3", 7: "last-3", 8: "last-3"}
    plan = plan_retention(entries, Policy(keep_last=3), NOW)
    assert plan.keep == [6, 7, 8]
    assert plan.delete == [0, 1, 2, 3, 4, 5, 9]  # the invalid latest step goes too
    assert plan.reasons[8] == ["last-3", "latest-valid"]


def test_thinning_by_hand():
    # ages 10m, 50m -> all tier; 70m and 100m share the clock hour 238 (238h50m and
    # 238h20m): only the newer is kept; 130m is hour 237 -> kept; 25h is beyond the last tier.
    ages = {1: 25 * H, 2: 130 * M, 3: 100 * M, 4: 70 * M, 5: 50 * M, 6: 10 * M}
    entries = [CatalogEntry(s, NOW - a) for s, a in ages.items()]
    plan = plan_retention(entries, Policy(thinning="1h:all,1d:1h"), NOW)
    assert plan.keep == [2, 4, 5, 6]
    assert plan.delete == [1, 3]
    assert plan.reasons == {
        2: ["thin:1h"],
        4: ["thin:1h"],
        5: ["thin:all"],
        6: ["thin:all", "latest-valid"],
    }


def test_thinning_tier_boundaries_and_future_entries():
    t = Thinning("1h:all,1d:1h")
    assert t.tier_index(-5) == 0  # clock skew: an entry from the future counts as age 0
    assert t.tier_index(H - 1) == 0
    assert t.tier_index(H) == 1  # the boundary belongs to the older tier
    assert t.tier_index(D - 1) == 1
    assert t.tier_index(D) is None


def test_thinning_prefers_a_valid_checkpoint_in_the_bucket():
    # steps 1 and 2 share hour bucket 10; the newer one is corrupt, so the older one stays
    entries = [CatalogEntry(1, 10 * H + 60), CatalogEntry(2, 10 * H + 120, valid=False)]
    entries.append(CatalogEntry(3, NOW))
    assert Thinning("1h:all,*:1h").select(entries, NOW) == {1: "thin:1h", 3: "thin:all"}


def test_hundreds_of_hourly_steps_by_hand():
    # 720 hourly steps (30 days), now = 720 h. all: ages < 24 h -> steps 697..719 (23).
    # 1d buckets, ages 24 h .. 167 h = steps 553..696: newest of days 23..29 ->
    # 575, 599, 623, 647, 671, 695, 696 (7). 7d buckets, steps <= 552: 167, 335, 503, 552 (4).
    entries = [CatalogEntry(i, i * H, metrics={"loss": abs(i - 100)}) for i in range(720)]
    policy = Policy(keep_last=5, thinning="1d:all,7d:1d,*:7d")
    plan = plan_retention(entries, policy, 720 * H)
    weekly = [167, 335, 503, 552]
    daily = [575, 599, 623, 647, 671, 695, 696]
    assert plan.keep == weekly + daily + list(range(697, 720))
    assert len(plan.keep) + len(plan.delete) == 720
    assert plan.reasons[715] == ["last-5", "thin:all"]
    # best 2 by loss = |step - 100|: step 100 (0) and the tie 99/101 (1) goes to the later step
    with_best = plan_retention(
        entries, Policy(5, "1d:all,7d:1d,*:7d", [("loss", "min", 2)]), 720 * H
    )
    assert set(with_best.keep) - set(plan.keep) == {100, 101}
    assert with_best.reasons[100] == ["best:loss"]


def test_keep_best_min_max_ties_missing_nan_invalid():
    entries = [
        CatalogEntry(1, 1, metrics={"loss": 2.0, "acc": 0.5}),
        CatalogEntry(2, 2, metrics={"loss": 1.0}),
        CatalogEntry(3, 3, metrics={"loss": 1.0, "acc": 0.9}),
        CatalogEntry(4, 4, metrics={"loss": float("nan"), "acc": 0.7}),
        CatalogEntry(5, 5, metrics={"loss": 0.1, "acc": 0.99}, valid=False),
        CatalogEntry(6, 6),
    ]
    assert KeepBest("loss", 1, "min").select(entries, NOW) == {3: "best:loss"}  # tie: later
    assert set(KeepBest("loss", 3, "min").select(entries, NOW)) == {1, 2, 3}
    assert set(KeepBest("acc", 2, "max").select(entries, NOW)) == {3, 4}
    assert KeepBest("missing", 2).select(entries, NOW) == {}


def test_pinned_is_kept_even_when_invalid():
    entries = hourly(6)
    entries[1] = CatalogEntry(1, H, pinned=True)
    entries[2] = CatalogEntry(2, 2 * H, pinned=True, valid=False)
    plan = plan_retention(entries, Policy(keep_last=1), NOW)
    assert plan.keep == [1, 2, 5]
    assert plan.reasons[1] == ["pinned"] and plan.reasons[2] == ["pinned"]


def test_latest_valid_kept_by_every_policy():
    entries = hourly(5) + [CatalogEntry(5, 5 * H, valid=False)]
    plan = plan_retention(entries, Policy(), NOW)  # no rule at all
    assert plan.keep == [4] and plan.reasons == {4: ["latest-valid"]}
    assert plan.delete == [0, 1, 2, 3, 5]


# ---------------------------------------------------------------- deltas, archive


def delta_chain() -> list[CatalogEntry]:
    """0 full, 1 delta on 0, 2 delta on 1 (a chain), 3 full, 4 delta on 3, 5 delta on 3."""
    bases = {1: 0, 2: 1, 4: 3, 5: 3}
    return [
        CatalogEntry(s, s * H, "delta" if s in bases else "full", bases.get(s)) for s in range(6)
    ]


def test_bases_of_kept_deltas_are_kept_transitively():
    entries = delta_chain()
    entries[2] = CatalogEntry(2, 2 * H, "delta", 1, pinned=True)
    plan = plan_retention(entries, Policy(keep_last=1), NOW)
    assert plan.keep == [0, 1, 2, 3, 5]
    assert plan.delete == [4]  # a deleted delta holds nothing
    assert plan.reasons[1] == ["base-of:2"]
    assert plan.reasons[0] == ["base-of:1"]
    assert plan.reasons[3] == ["base-of:5"]


def test_missing_base_is_reported():
    entries = [CatalogEntry(7, 7 * H, "delta", 3)]
    plan = plan_retention(entries, Policy(keep_last=1), NOW)
    assert plan.keep == [7]
    assert plan.warnings == ["step 7 needs base step 3, which is not in the catalog"]


def test_archive_entries_count_for_rules_but_are_never_planned():
    # hour bucket 5 holds step 1 (hot) and step 2 (archived, newer): the archive copy
    # represents the bucket, so the hot one goes. Hour 1 holds steps 0 and 5 (newer): step 0
    # is kept only as the base of the archived delta 3.
    entries = [
        CatalogEntry(0, 1 * H),
        CatalogEntry(1, 5 * H + 10),
        CatalogEntry(2, 5 * H + 20, tier="archive"),
        CatalogEntry(3, 6 * H, "delta", 0, tier="archive"),
        CatalogEntry(4, 9 * H),
        CatalogEntry(5, 1 * H + 30),
    ]
    plan = plan_retention(entries, Policy(thinning="*:1h"), 9 * H + 1)
    assert plan.keep == [0, 4, 5]
    assert plan.delete == [1]
    assert plan.reasons == {0: ["base-of:3"], 4: ["thin:1h"], 5: ["thin:1h", "latest-valid"]}


def test_a_step_listed_hot_and_archived_is_planned_as_hot():
    entries = [CatalogEntry(1, H, tier="archive"), CatalogEntry(1, H), CatalogEntry(2, 2 * H)]
    plan = plan_retention(entries, Policy(keep_last=1), NOW)
    assert plan.keep == [2] and plan.delete == [1]


def test_select_for_archive_by_hand():
    entries = delta_chain()
    entries[4] = CatalogEntry(4, 4 * H, "delta", 3, pinned=True)
    entries.append(CatalogEntry(6, 6 * H, valid=False))
    # older than 2.5 h at now = 6 h: steps 0..3 by age. 3 is the base of hot deltas 4, 5
    # that stay hot -> 3 stays. 0..2 (a full and its delta chain) move together.
    assert select_for_archive(entries, 2.5 * H, 6 * H) == [0, 1, 2]
    # everything old enough: 0..4 (pinned 4 too); 5 is the latest valid, so its base 3 stays
    assert select_for_archive(entries, 0.5 * H, 6 * H) == [0, 1, 2, 4]
    # already archived entries are not selected again
    archived = [CatalogEntry(e.step, e.committed_at, tier="archive") for e in entries[:3]]
    assert select_for_archive(archived + entries[3:], 2.5 * H, 6 * H) == []


# ---------------------------------------------------------------- repeated GC over time


def test_repeated_gc_on_a_stream_of_saves_keeps_one_per_bucket():
    # a save every 10 minutes for 3 days, GC after each save
    policy = Policy(thinning="2h:all,1d:1h,*:1d")
    catalog: dict[int, CatalogEntry] = {}
    for k in range(1, 3 * 144 + 1):
        now = k * 10 * M
        catalog[k] = CatalogEntry(k, now)
        for step in plan_retention(catalog.values(), policy, now).delete:
            del catalog[step]
    now = 3 * D
    kept = sorted(catalog)
    # all tier: ages < 2h -> steps 421..432 (12); 1h tier: ages [2h, 1d) -> newest per clock
    # hour = steps 6h+... each hour's :50 save, hours 48..69 plus hour 70's 70:00 save (k=420)
    hour_steps = [h * 6 + 5 for h in range(48, 70)] + [420]
    # 1d tier: ages >= 1d -> steps <= 288: newest of day 0 (k=143, 23:50) and of day 1
    # (k=287). k=288 (48:00, day 2) reached the 1d tier only now, but GC deleted it an hour
    # after it was saved, when k=293 became the newest of hour 48: deletions are final.
    assert kept == [143, 287] + hour_steps + list(range(421, 433))
    assert plan_retention(catalog.values(), policy, now).delete == []


# ---------------------------------------------------------------- invariants (hypothesis)


@st.composite
def catalogs(draw):
    steps = sorted(draw(st.sets(st.integers(0, 400), min_size=0, max_size=25)))
    entries = []
    t = 0.0
    for i, step in enumerate(steps):
        t += draw(st.floats(0, 3 * D))
        earlier = steps[:i] + [10_000]  # 10_000: a base missing from the catalog
        base = draw(st.one_of(st.none(), st.sampled_from(earlier)))
        entries.append(
            CatalogEntry(
                step,
                t,
                "full" if base is None else "delta",
                base,
                pinned=draw(st.booleans()) and draw(st.booleans()),
                metrics=draw(st.dictionaries(st.sampled_from(["loss", "acc"]), st.floats(0, 1))),
                tier=draw(st.sampled_from(["hot", "hot", "hot", "archive"])),
                valid=draw(st.sampled_from([True, True, True, False])),
            )
        )
    return entries, t + draw(st.floats(0, 10 * D))


policies = st.builds(
    Policy,
    keep_last=st.integers(0, 6),
    thinning=st.sampled_from([None, "2h:all,1d:1h,7d:1d,*:7d", "1d:6h", "3h:all,*:2d"]),
    keep_best=st.lists(
        st.tuples(
            st.sampled_from(["loss", "acc"]), st.sampled_from(["min", "max"]), st.integers(1, 3)
        ),
        max_size=2,
    ),
)


@settings(max_examples=120, deadline=None)
@given(catalogs(), policies)
def test_retention_invariants(catalog, policy):
    entries, now = catalog
    by_step = {e.step: e for e in entries}
    hot = {e.step for e in entries if e.tier == "hot"}
    plan = plan_retention(entries, policy, now)
    keep, delete = set(plan.keep), set(plan.delete)
    assert keep | delete == hot and not keep & delete
    assert plan.keep == sorted(keep) and plan.delete == sorted(delete)
    assert set(plan.reasons) == keep and all(plan.reasons[s] for s in keep)
    valid = [e.step for e in entries if e.valid]
    if valid and max(valid) in hot:
        assert max(valid) in keep
    assert {e.step for e in entries if e.pinned and e.tier == "hot"} <= keep
    for e in entries:  # bases of kept or archived entries survive
        if (e.step in keep or e.tier == "archive") and e.base_step in hot:
            assert e.base_step in keep
    # a rule added never deletes more
    assert keep >= set(plan_retention(entries, Policy(keep_last=policy.keep_last), now).keep)
    # GC is idempotent: planning again on the survivors deletes nothing
    survivors = [e for e in entries if e.step not in delete]
    again = plan_retention(survivors, policy, now)
    assert again.delete == [] and again.keep == plan.keep
    assert all(by_step[s].tier == "hot" for s in plan.keep)


@settings(max_examples=120, deadline=None)
@given(catalogs(), st.floats(0, 5 * D))
def test_archive_selection_invariants(catalog, older_than):
    entries, now = catalog
    by_step = {e.step: e for e in entries}
    chosen = set(select_for_archive(entries, older_than, now))
    valid = [e.step for e in entries if e.valid]
    for s in chosen:
        e = by_step[s]
        assert e.tier == "hot" and e.valid and now - e.committed_at > older_than
        assert s != max(valid)
    for e in entries:  # no delta that stays hot loses its base to the archive
        if e.tier == "hot" and e.step not in chosen:
            assert e.base_step not in chosen


def test_nothing_is_deleted_when_no_step_is_valid():
    # e.g. a lost or replaced root marker: every manifest fails the root-id check at once
    entries = [CatalogEntry(i, i * H, valid=False) for i in range(4)]
    plan = plan_retention(entries, Policy(keep_last=1), NOW)
    assert plan.delete == [] and plan.keep == [0, 1, 2, 3]
    assert all(r == ["no-valid-step"] for r in plan.reasons.values())
    assert any("no step is valid" in w for w in plan.warnings)
    archived = [*entries, CatalogEntry(9, 9 * H, tier="archive")]  # one valid copy somewhere
    assert plan_retention(archived, Policy(keep_last=1), NOW).delete == [0, 1, 2, 3]


def test_per_kind_rules_keep_deltas_a_week_and_fulls_a_month_by_hand():
    # a full every 4 days (steps 0, 4, 8, ...) and deltas between, one per day, 40 days
    entries = [
        CatalogEntry(
            d, d * D, "full" if d % 4 == 0 else "delta", None if d % 4 == 0 else d // 4 * 4
        )
        for d in range(40)
    ]
    now = 40 * D
    plan = plan_retention(entries, "delta=7d,full=30d", now)
    # deltas younger than 7 d: days 34, 35, 37, 38, 39 (36 is a full); fulls younger than 30 d:
    # days 12, 16, ..., 36; the latest 39 is a delta (also latest-valid); bases of kept deltas
    # (32 for 34, 35; 36 for 37-39) are kept anyway
    fulls = [d for d in range(12, 40, 4)]
    assert plan.keep == sorted({34, 35, 37, 38, 39, *fulls, 32})
    assert plan.reasons[35] == ["kind:delta<7d"] and plan.reasons[12] == ["kind:full<30d"]
    assert "base-of:34" in plan.reasons[32] and 8 in plan.delete and 33 in plan.delete

"""Minimal sequences the adversary (tests/faults/adversary/) found, replayed one by one.

Each was a defect of issue 14 (or one found with them), shrunk by hypothesis and then by hand to
the fewest operations; each names the invariant it broke and the Violation it raised. All are
fixed on main now, so each is a plain regression test: the sequence must run with every
invariant holding. A sequence that still breaks one goes in as an xfail(strict=True) with
`raises=` its violation and a reason naming it, until its fix lands.
"""

from __future__ import annotations

import pytest

from tests.faults.adversary import GROUPS, replay
from tests.faults.adversary.truth import (
    BadSave,
    NeededDeleted,
    NewestLost,
    NotClean,
    WrongBytes,
)

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def save(**kw):
    return ("save", {"block": True, "change": "new", "gap": 1, "restart": None, **kw})


def gc(keep: int, grace: str):
    return ("gc", {"keep": keep, "grace": grace})


def ls():
    return ("inspect", {"cmd": "ls"})


def load(how: str = "newest, fresh process", pick: int = 0):
    return ("load", {"pick": pick, "how": how})


def race(kind: str, at: int, *, pin: bool, saves: list, deleter: str | None):
    return (
        "load_racing_deleters",
        {"kind": kind, "at": at, "pin": pin, "saves": saves, "deleter": deleter},
    )


def obj(how: str, pick: int = 0, which: str = "the newest step's own"):
    return ("damage_object", {"pick": pick, "pick2": 0, "n": 0, "how": how, "which": which})


def json_(kind: str, how: str, field: int = 0, hostile: str = "nest", pick: int = 0):
    args = {"pick": pick, "pick2": 0, "kind": kind, "how": how, "n": 0}
    return ("damage_json", {**args, "field": field, "hostile": hostile})


def manifest(how: str, field: int = 0, hostile: str = "nest", consistent: bool = True):
    args = {"pick": 0, "pick2": 0, "how": how, "consistent": consistent}
    return ("forge_manifest", {**args, "field": field, "hostile": hostile})


def archived(to: str, pick: int = 0, hostile: str = ""):
    return ("forge_archived", {"pick": pick, "to": to, "hostile": hostile})


# id: (defect it was, violation it raised before its fix, steps[, machine options])
REPLAYS = {
    "root-marker-deleted-gc-deletes-every-step": (
        "root marker lost: gc treats every step as foreign and deletes the newest (c)",
        NeededDeleted,
        [save(), save(), json_("root marker", "delete"), gc(1, "1h")],
    ),
    "root-marker-deleted-next-save-orphans": (
        "root marker lost: the next save creates a new root id and orphans every step (e)",
        BadSave,
        [save(), json_("root marker", "delete"), save()],
    ),
    "root-marker-forged-id-next-save-orphans": (
        "root marker's root_id forged (any string): the next save commits under it (e)",
        BadSave,
        [save(), json_("root marker", "forge", field=3, hostile="string"), save()],
    ),
    "same-size-flip-gc-last-1": (
        "same-size flip in the newest step: gc last=1 keeps it, deletes the last good step (c)",
        NeededDeleted,
        [save(), save(), obj("flip"), gc(1, "0")],
    ),
    "dedup-reuses-bit-rotted-object": (
        "a save deduplicates against an object flipped (same size) since: commits it (e)",
        BadSave,
        [save(), obj("flip", pick=3), save()],
    ),
    "dedup-reuses-deleted-object": (
        "a save deduplicates against an object deleted since: commits without it (e)",
        BadSave,
        [save(), obj("delete", pick=3), save()],
    ),
    "delta-base-object-deleted": (
        "a delta save references its base's object, deleted since: commits without it (e)",
        BadSave,
        [save(), obj("delete", pick=0), save()],
        {"full_every": 2},
    ),
    "gc-grace-0-during-save-before-manifest": (
        "gc --grace 0 frees the objects of a save in flight, which then commits (e)",
        BadSave,
        [save(), ("gc_during_save", {"phase": "manifest", "keep": 1, "grace": "0"})],
    ),
    "gc-grace-0-during-save-before-commit": (
        "gc --grace 0 deletes the manifest of a save in flight, whose COMMIT then names it (e)",
        BadSave,
        [save(), ("gc_during_save", {"phase": "COMMIT", "keep": 1, "grace": "0"})],
    ),
    "item-keys-collide": (
        "item keys fqn@offsets collide (tensor a, value a@0): the save commits an unloadable step (e)",
        BadSave,
        [save()],
        {"names": "colliding"},
    ),
    "load-into-float64-converts": (
        "a load into float64 tensors converts silently instead of refusing (a)",
        WrongBytes,
        [save(), load("step into float64")],
    ),
    "duplicate-chunk-passes-validation": (
        "a manifest listing a chunk twice passes validation: row 1 of w is never loaded (a)",
        WrongBytes,
        [save(), manifest("duplicate chunk"), load()],
    ),
    "archived-redirects-to-another-run": (
        "an ARCHIVED marker naming another run's root: the newest step loads that run's data (a)",
        WrongBytes,
        [save(), save(), archived("foreign run")],
    ),
    "archived-http-breaks-ls": (
        "an http:// ARCHIVED marker on an old step: ls fails as a whole, naming no file (d)",
        NotClean,
        [save(), save(), archived("http", pick=1)],
    ),
    "archived-relative-uri": (
        "ARCHIVED {uri: 'yesterday'} is read relative to the working directory; load() fails "
        "instead of falling back, naming no file (d)",
        NotClean,
        [save(), save(), archived("dangling", hostile="string")],
    ),
    "archived-hot-root-gc-frees-it": (
        "ARCHIVED naming the hot root itself: gc frees that step's objects as archived; the next "
        "deduplicating save commits without them (e)",
        BadSave,
        [save(), save(), archived("hot root"), gc(1, "0"), save(change="same")],
    ),
    "archive-crash-tears-archived": (
        "ARCHIVED is written in place: an archive run dying while writing it tears it (c)",
        NeededDeleted,
        [save(), save(), ("crash_archive", {"after": 0, "at": "ARCHIVED", "grace": "0"})],
    ),
    "archive-to-symlink-alias": (
        "archive --to a symlink of the hot root deletes the only copy (c)",
        NeededDeleted,
        [save(), save(), ("archive", {"to": "symlink alias", "grace": "0"})],
    ),
    "archive-to-double-slash-alias": (
        "archive --to //<hot root> deletes the only copy (c)",
        NeededDeleted,
        [save(), save(), ("archive", {"to": "double-slash alias", "grace": "0"})],
    ),
    "archive-to-alias-then-gc": (
        "archived to an alias with the default grace, the step's objects are freed by gc (c)",
        NeededDeleted,
        [save(), save(), save(), ("archive", {"to": "symlink alias", "grace": "1h"}), gc(2, "0")],
    ),
    "nested-manifest-crashes-load": (
        "a 50,000-deep manifest (checksum matching) crashes load and ls with RecursionError (d)",
        NotClean,
        [save(), manifest("field", hostile="nest"), load()],
    ),
    "huge-int-manifest-crashes-load": (
        "a manifest holding a 5,000-digit integer crashes load and ls with ValueError (d)",
        NotClean,
        [save(), manifest("field", hostile="inflate"), load()],
    ),
    "huge-int-root-marker-crashes-ls": (
        "a root marker holding a 5,000-digit integer crashes load and ls with ValueError (d)",
        NotClean,
        [save(), json_("root marker", "forge", field=2, hostile="inflate"), ls()],
    ),
    "nested-pin-crashes-ls": (
        "a 50,000-deep PIN crashes ls and gc with RecursionError (d)",
        NotClean,
        [save(), ("pin", {"pick": 0, "pin": True}), json_("PIN", "forge")],
    ),
    "nested-eval-crashes-ls": (
        "a 50,000-deep eval.json crashes ls and gc with RecursionError (d)",
        NotClean,
        [save(), json_("eval.json", "forge")],
    ),
    "nested-archived-crashes-ls": (
        "a 50,000-deep ARCHIVED crashes load, ls and gc with RecursionError (d)",
        NotClean,
        [save(), archived("archive root", hostile="nest"), ls()],
    ),
    "list-pending-manifest-crashes-gc": (
        "a list-shaped manifest in an uncommitted folder crashes gc with AttributeError (d)",
        NotClean,
        [save(), ("plant_pending", {"how": "list", "ahead": 1}), gc(1, "1h")],
    ),
    "nested-pending-manifest-crashes-gc": (
        "a 50,000-deep manifest in an uncommitted folder crashes gc with RecursionError (d)",
        NotClean,
        [save(), ("plant_pending", {"how": "nest", "ahead": 1}), gc(1, "1h")],
    ),
    "manifest-stats-null-crashes-ls": (
        "a manifest whose stats is null (checksum matching) crashes ls with TypeError (d)",
        NotClean,
        [save(), manifest("field", field=2, hostile="null"), ls()],
    ),
    "commit-committed-at-string-crashes-ls": (
        "a COMMIT whose committed_at is a string crashes ls with ValueError (d)",
        NotClean,
        [save(), json_("COMMIT", "forge", field=3, hostile="string"), ls()],
    ),
    "file-in-the-way-reads-already-exists": (
        "a file where a step folder belongs fails the save as '<intent> already exists': errors "
        "classified by type, not by what happened (d)",
        NotClean,
        [save(), ("damage_folder", {"pick": 0, "pick2": 0, "how": "file in the way", "ahead": 0}),
         save()],
    ),
    "s3-restart-gap-save-object-missing": (
        "S3 only: after a trainer restart, a save at step 4 (step 2 before it, each after a "
        "restart, ls and load between) reports success, but load(step=4) of it fails: "
        "objects/8e/8edb... 'data file is missing' (e)",
        BadSave,
        [save(change="same", gap=2, restart=1), save(gap=2, restart=1)],
        {"backend": "s3"},
    ),
    "object-shadowed-by-a-folder-fails-the-load": (
        "slow run: the newest step's object replaced by a folder fails load(None) with 'a path "
        "component is a file, not a folder' instead of falling back to the intact step (b)",
        NewestLost,
        [save(), save(), obj("shadow")],
    ),
    "dangling-archived-in-a-pending-folder-breaks-the-save": (
        "slow run: a forged ARCHIVED in the folder of a step not yet saved: the save of that "
        "step reports success with the marker left in it, so it never loads (e)",
        BadSave,
        [save(), ("plant_pending", {"how": "list", "ahead": 1}),
         ("crash_save", {"after": 0, "at": None, "block": False}),
         archived("dangling", pick=0), save()],
    ),
    "archive-root-marker-lost-gc-deletes-the-archived-step": (
        "slow run: the archive root's marker deleted: the archived step's redirect was refused "
        "as 'has no root marker', the step counted as corrupt and gc last=2 deleted its hot "
        "folder, orphaning the intact archived copy (c)",
        NeededDeleted,
        [save(), save(), ("archive", {"grace": "0", "to": "archive root"}),
         json_("archive root marker", "delete", hostile="bool"), gc(2, "0")],
    ),
    "s3-emptied-object-fails-the-load": (
        "slow S3 run: an object of the newest step emptied (0 bytes) fails load(None) with "
        "OSError 'The requested range is not satisfiable' (a ranged read of an empty object, "
        "HTTP 416) instead of falling back to the intact step (d)",
        NotClean,
        [save(), save(), obj("empty")],
        {"backend": "s3"},
    ),
    # issue 37 defect 2: the step being read is deleted by GC after a newer commit; the load
    # called it corrupt and fell back to the older step (found by the races variant)
    "load-racing-commit-and-gc-falls-back-to-an-older-step": (
        "a load racing two commits and gc last=1 called the deleted step corrupt, then failed "
        "on the older one GC deleted too ('step 1 has no committed checkpoint') (b)",
        NewestLost,
        [save(), save(),
         race("object", 0, pin=False, saves=["save same", "save"], deleter="gc last=1")],
    ),
    "load-racing-commit-and-gc-reports-a-pinned-step-deleted": (
        "a load racing a pin, a commit and gc last=1 called the deleted step corrupt and "
        "returned the older pinned step, not the newer intact one (b)",
        NewestLost,
        [save(), save(), race("manifest", 0, pin=True, saves=["save"], deleter="gc last=1")],
    ),
}  # fmt: skip


# id: (defect, reason it is still expected to fail) for sequences that still break an invariant.
STILL_FAILING: dict[str, str] = {}


def _param(key: str):
    spec = REPLAYS[key]
    if key not in STILL_FAILING:
        return pytest.param(key, id=key)
    marks = [pytest.mark.xfail(strict=True, raises=spec[1], reason=STILL_FAILING[key])]
    if len(spec) > 3 and spec[3].get("backend") == "s3":
        marks.append(pytest.mark.s3)
    return pytest.param(key, id=key, marks=marks)


@pytest.mark.parametrize("case", [_param(key) for key in REPLAYS])
def test_replay(case, fault, request):
    """The sequence that once broke an invariant now keeps every invariant (the Violation
    named in REPLAYS is what it raised before its fix)."""
    defect, violation, steps, *options = REPLAYS[case]
    fault("adversary", f"replay: {defect}", cases=1, detail=f"{len(steps)} operations")
    options = dict(options[0]) if options else {}
    if options.get("backend") == "s3":  # the in-process S3 server of tests/conftest.py
        options["bucket"] = request.getfixturevalue("s3_bucket")
    replay(GROUPS, steps, **options)

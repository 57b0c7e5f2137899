"""The adversarial model of the storage (issue 14): a hypothesis state machine that runs random
sequences of saves, loads, GC, archive, pins and damage against a checkpoint root, and checks
the invariants of truth.py after every operation.

Operations: saves (sync or async, full or delta through `full_every`, deduplicated through
tensors that stay frozen), a trainer restart, loads (the newest, a given step, into another
dtype), `ckptflow ckpt` ls / ls --verify / verify / pin / unpin / gc (last=N, --grace 0 or 1h)
/ archive (to the archive root or to an alias of the hot root), GC while a save is held between
its data and its manifest or COMMIT, a tool or save that dies at its N-th write (a local
in-place write then leaves half of its bytes), an evaluator writing eval.json, a load with
saves, GC, archive and pins fired at a generated read of it (races.py). Damage: see
damage.py. Which of them a machine uses is its `groups` (see `make_machine`); `replay` runs
one given sequence (a regression test of a sequence hypothesis found).

The machine runs on local disk or on the in-process S3 server; `roots` gives each example a
fresh hot root and archive root, an alias of the hot root (local: a symlink, and a `//`
spelling) and a read-only root of another run (for foreign objects, markers and redirects).
"""

from __future__ import annotations

from tests.faults.adversary.attacks import AttackRules
from tests.faults.adversary.machine import GROUPS, Machine, Stats
from tests.faults.adversary.races import RaceRules
from tests.faults.adversary.tools import ToolRules


class Adversary(RaceRules, AttackRules, ToolRules, Machine):
    """The whole machine: saves and loads (Machine), tools (ToolRules), damage (AttackRules),
    loads racing saves and deleters (RaceRules)."""


def make_machine(name: str, groups, backend: str = "local", bucket: str | None = None):
    """An Adversary subclass using only `groups` (see GROUPS), with its own Stats."""
    unknown = set(groups) - set(GROUPS)
    if unknown:
        raise ValueError(f"unknown groups {sorted(unknown)}")
    return type(
        f"Adversary_{name}_{backend}".replace("-", "_"),
        (Adversary,),
        {"groups": frozenset(groups), "backend": backend, "bucket": bucket, "stats": Stats()},
    )


def replay(
    groups,
    steps,
    *,
    full_every: int = 1,
    names: str = "plain",
    backend: str = "local",
    bucket: str | None = None,
) -> None:
    """Run one sequence of rules, [(rule name, keyword arguments)], on a fresh machine with
    the invariants checked after each, as hypothesis runs it (a Violation is raised)."""
    machine = make_machine("replay", groups, backend, bucket)()
    try:
        machine.start(full_every=full_every, names=names)
        machine.newest_intact_step_loads_and_is_listed()
        for name, kwargs in steps:
            getattr(machine, name)(**kwargs)
            machine.newest_intact_step_loads_and_is_listed()
    finally:
        machine.teardown()

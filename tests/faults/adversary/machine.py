"""The core of the adversary's state machine: saves, loads, and the invariants after every
operation (see the package docstring). Tools and damage are the mixins of tools.py and
attacks.py."""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
from collections import Counter
from dataclasses import dataclass, field
from typing import ClassVar

import hypothesis
import torch
from ckptflow.steps.checkpoint import Checkpointer
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ckptflow.core import layout
from ckptflow.core.storage import Storage, StorageError
from tests.faults.adversary.storage import AdversaryStorage, Countdown, SimulatedCrash, make_roots
from tests.faults.adversary.truth import (
    ABSENT,
    BadSave,
    NewestLost,
    Probe,
    Truth,
    WrongBytes,
    check_api_error,
    clone,
    diff,
    make_state,
    run_cli,
    zeros_like,
)

GROUPS = ("gc", "inflight", "archive", "crash", "objects", "json", "folders", "names", "races")


# -- counts ----------------------------------------------------------------------------------------
@dataclass
class Stats:
    """What a run of the machine did, for the fault records and docs/reliability.md."""

    sequences: int = 0
    operations: int = 0
    rules: Counter = field(default_factory=Counter)
    damage: Counter = field(default_factory=Counter)

    def detail(self) -> str:
        kinds = ", ".join(f"{k} x{n}" for k, n in sorted(self.damage.items()))
        return (
            f"{self.sequences} sequences, {self.operations} operations; "
            f"{len(self.damage)} damage kinds: {kinds or 'none'}"
        )

    def as_dict(self) -> dict:
        return {
            "sequences": self.sequences,
            "operations": self.operations,
            "rules": dict(self.rules),
            "damage": dict(self.damage),
        }


def note(message: str) -> None:
    """hypothesis.note inside a test case (printed with a failing sequence), else nothing (a
    replay of a sequence, see `replay`)."""
    with contextlib.suppress(InvalidArgument):
        hypothesis.note(message)


# Which of the current files or steps a rule acts on: an index, taken modulo their number.
# (Drawing from a list whose length depends on the storage would make hypothesis's data
# generation depend on it, and replays flaky.)
PICK = st.integers(0, 63)


def choose(items, pick: int):
    """items[pick], modulo their number; None when there are none."""
    items = list(items)
    return items[pick % len(items)] if items else None


def refusable(fn):
    """For a rule that writes through Storage into a root the adversary damaged: the storage
    may refuse (a file where a folder should be); that is part of the damage, not a failure
    of the model."""

    @functools.wraps(fn)
    def run(self, *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        except (OSError, StorageError) as exc:
            self._damaged(f"{fn.__name__}: refused", f"the storage refused part of it: {exc}")

    return run


def has(group: str | None = None):
    """Precondition: the machine uses `group`, and a save was tried already (a rule with
    nothing to act on would only make sequences longer).

    Only what the sequence of rules decides, never what the engine did: whether a save
    succeeded can vary between two runs of one sequence (threads, timing), and a precondition
    that varies makes hypothesis's replays draw differently (FlakyStrategyDefinition, the end
    of the first slow runs). Rules with nothing to act on do nothing."""
    return precondition(lambda self: (group is None or group in self.groups) and self.saves > 0)


class Machine(RuleBasedStateMachine):
    """Saves, loads and the invariants; `make_machine` adds the tools and attacks and picks the
    backend and the rule groups."""

    groups: ClassVar[frozenset[str]] = frozenset(GROUPS)
    backend: ClassVar[str] = "local"
    bucket: ClassVar[str | None] = None
    stats: ClassVar[Stats] = Stats()

    def __init__(self):
        super().__init__()
        self.roots = make_roots(self.backend, self.bucket)
        self.stores = {"hot": Storage(self.roots.hot), "arch": Storage(self.roots.arch)}
        self.probe = Probe(self.stores)
        self.truth = Truth(self.probe)
        self.ck: Checkpointer | None = None
        self.state: dict = {}
        self.seed, self.frozen, self.next_step = 1, 1, 1
        self.names, self.full_every = "plain", 1
        self.saves = 0  # save rules run so far (preconditions: see `has`)
        self.damaged = False  # any damage done so far (a save may then fail cleanly)
        self.dirty = True  # something changed since the invariants were last checked
        self.stats.sequences += 1

    # -- plumbing --------------------------------------------------------------------------------
    def _op(self, name: str) -> None:
        self.stats.operations += 1
        self.stats.rules[name] += 1
        self.probe.clear()

    def _damaged(self, kind: str, what: str) -> None:
        note(f"damage: {what}")
        self.stats.damage[kind] += 1
        self.damaged = self.dirty = True
        self.probe.clear()

    def _cli(self, *argv: str) -> tuple[int, str, str]:
        rc, out, err = run_cli(list(argv), self.roots.all())
        note(f"`ckptflow {' '.join(argv)}` -> {rc} {err.strip()[:300]}")
        return rc, out, err

    def _new_ck(self) -> None:
        if self.ck is not None:
            # (a failure of its last save was already reported by that save)
            with contextlib.suppress(BaseException):
                self.ck.close()
        self.ck = Checkpointer(
            "unused",
            storage=AdversaryStorage(self.roots.hot),
            full_every=self.full_every,
            threads=2,
        )

    def teardown(self):
        if self.ck is not None:
            with contextlib.suppress(BaseException):
                self.ck.close()
        if self.roots.base:
            shutil.rmtree(self.roots.base, ignore_errors=True)

    def _hot_steps(self, root: str = "hot") -> list[int]:
        out = []
        for name in self.stores[root].listdir():
            s = layout.parse_step_dir(name)
            if s is not None:
                out.append(s)
        return sorted(out)

    def _committed_hot(self) -> list[int]:
        return [
            s
            for s in self._hot_steps()
            if self.probe.digest("hot", layout.commit_path(s)) != ABSENT
        ]

    def _step_or_none(self, pick: int) -> int | None:
        # newest first: the shrinker moves towards the first element
        steps = sorted(set(self.truth.saved) | set(self._hot_steps()), reverse=True)
        return choose(steps, pick)

    # -- setup -----------------------------------------------------------------------------------
    @initialize(
        full_every=st.sampled_from([1, 2, 3]), names=st.sampled_from(["plain", "colliding"])
    )
    def start(self, full_every: int, names: str) -> None:
        self.full_every = full_every
        self.names = names if "names" in self.groups else "plain"
        self.state = make_state(self.seed, self.frozen, self.names)
        self._new_ck()

    # -- saves -----------------------------------------------------------------------------------
    @rule(
        block=st.booleans(),
        change=st.sampled_from(["new", "same", "frozen"]),
        gap=st.integers(1, 2),
        restart=st.sampled_from([None, 1, 2, 3]),
    )
    def save(self, block: bool, change: str, gap: int, restart: int | None) -> None:
        """A save: `new` tensors change, `same` nothing but the step value changes (everything is
        deduplicated), `frozen` the frozen tensors change too. `restart=N`: the trainer first
        restarts with full_every=N (no deduplication table, no delta base in memory)."""
        self._op("save")
        if restart is not None:
            self.stats.rules["restart"] += 1
            self.full_every = restart
            self._new_ck()
        self._save(block, change, gap)

    @precondition(lambda self: "crash" in self.groups)
    @rule(
        block=st.booleans(),
        after=st.integers(0, 3),
        at=st.sampled_from([None, "root marker", "intent", "object", "manifest", "COMMIT"]),
    )
    def crash_save(self, block: bool, after: int, at: str | None) -> None:
        """A save whose process dies at its `after`-th write of kind `at` (None: any); the
        trainer then restarts."""
        self._op("crash_save")
        self._save(block, "new", 1, crash=Countdown(after, at))

    def _save(self, block, change, gap, crash=None, hold=None, during=None) -> None:
        self.saves += 1
        step = self.next_step + gap - 1
        self.next_step = step + 1
        if change == "new":
            self.seed += 1
        elif change == "frozen":
            self.seed, self.frozen = self.seed + 1, self.frozen + 1
        self.state = make_state(self.seed, self.frozen, self.names) | {"step": step}
        snap = clone(self.state)
        store = self.ck.storage
        store.countdown = crash or Countdown()
        if hold:
            store.hold(hold)
        self.dirty = True
        try:
            handle = self.ck.save(step, self.state, block=block)
            if not block:  # training goes on while the background write runs
                for v in self.state.values():
                    if isinstance(v, torch.Tensor):
                        v.add_(1)
            if during is not None:
                while not store.reached.wait(0.01) and not handle.done():
                    pass
                during()
            store.release.set()
            handle.wait()
        except SimulatedCrash:
            note(f"save of step {step} died at a write")
            self._new_ck()
            return
        except BaseException as exc:
            if isinstance(exc, AssertionError):
                raise
            check_api_error(f"save of step {step}", exc, self.roots.all())
            note(f"save of step {step} failed cleanly: {exc}")
            if not self.damaged and during is None:
                raise BadSave(f"save of step {step} failed on an undamaged root: {exc}") from None
            self._new_ck()
            return
        finally:
            store.release.set()
            store.hold_phase, store.countdown = None, Countdown()
        self._committed(step, snap)

    def _committed(self, step: int, snap: dict) -> None:
        """Invariant (e): a save that reported success committed an intact step that loads back
        exactly, under the same root id as the intact steps already there."""
        self.probe.clear()
        rec = self.truth.record(step, snap)
        if rec is None:
            sd = layout.step_dir(step)
            raise BadSave(
                f"save of step {step} returned success but left no readable COMMIT and manifest: "
                f"{sd} holds {sorted(self.stores['hot'].listdir(sd))}"
            )
        note(f"saved step {step} ({rec.kind}, base {rec.base_step}, {len(rec.sizes)} objects)")
        bad = self.truth.bad_deps(step)
        if bad:
            raise BadSave(
                f"save of step {step} returned success, but files it needs are damaged: {bad[:5]}"
            )
        self._load(step, must=True, why="it was just saved", fail=BadSave)
        orphans = [
            s
            for s, r in self.truth.saved.items()
            if s != step and r.root_id != rec.root_id and self.truth.data_intact(s)
        ]
        if orphans:
            raise BadSave(
                f"save of step {step} committed under root id {rec.root_id}, but the intact steps "
                f"{orphans} carry {self.truth.saved[orphans[0]].root_id}: they are orphaned"
            )

    # -- loads -----------------------------------------------------------------------------------
    def _load(
        self, step, must: bool, why: str = "", fresh: bool = True, dtype=None, fail=NewestLost
    ):
        """Load `step` (None: the newest valid); invariant (a) on success; when `must`, a failure
        raises `fail` (invariant (b), or (e) for a step just saved)."""
        ck = Checkpointer(self.roots.hot, threads=2) if fresh else self.ck
        target = zeros_like(self.state, dtype)
        try:
            got = ck.load(target, step=step)
        except AssertionError:
            raise
        except BaseException as exc:
            check_api_error(f"load(step={step})", exc, self.roots.all())
            if must:
                raise fail(f"load(step={step}) failed although {why}: {exc}") from None
            return None
        finally:
            if fresh:
                ck.close()
        rec = self.truth.saved.get(got)
        if rec is None:
            raise WrongBytes(f"load(step={step}) returned step {got}, which no save committed")
        d = diff(rec.state, target)
        if d:
            raise WrongBytes(f"load(step={step}) returned step {got} with {d}")
        return got

    @has()
    @rule(
        pick=PICK,
        how=st.sampled_from(
            ["newest, fresh process", "newest, trainer", "step", "step into float64"]
        ),
    )
    def load(self, pick: int, how: str) -> None:
        """Resume from the newest valid step (a fresh process, or the trainer itself), or load a
        given step; into float64 tensors (names group) it must be refused, or (a) fails."""
        self._op("load")
        self.probe.clear()
        if how.startswith("newest"):
            newest = self.truth.newest(self.truth.intact)
            why = f"step {newest} is intact"
            got = self._load(None, must=newest is not None, why=why, fresh=how.endswith("process"))
            if newest is not None and got < newest:
                raise NewestLost(f"load() returned step {got}, older than the intact step {newest}")
            return
        step = self._step_or_none(pick)
        if how.endswith("float64") and "names" in self.groups:
            self._load(step, must=False, dtype=torch.float64)
        else:
            self._load(
                step, must=step in self.truth.saved and self.truth.intact(step), why="it is intact"
            )

    # -- the invariants after every operation ----------------------------------------------------
    @invariant()
    def newest_intact_step_loads_and_is_listed(self) -> None:
        """(b): `load()` returns the newest intact step or a newer one (checked by (a)), and
        `ckptflow ckpt ls` lists it as committed."""
        if not self.dirty:
            return
        self.dirty = False
        self.probe.clear()
        newest = self.truth.newest(self.truth.intact)
        if newest is None:
            return
        got = self._load(None, must=True, why=f"step {newest} is intact")
        if got < newest:
            raise NewestLost(f"load() returned step {got}, older than the intact step {newest}")
        rc, out, err = self._cli("ckpt", "ls", self.roots.hot, "--json")
        if rc != 0:
            raise NewestLost(
                f"`ckpt ls` failed (exit {rc}) while step {newest} is intact: {err.strip()}"
            )
        state = {r["step"]: r["state"] for r in json.loads(out)}.get(newest)
        if state != "committed":
            raise NewestLost(f"`ckpt ls` shows the intact step {newest} as {state}")

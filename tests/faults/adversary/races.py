"""The adversary's reader-deleter races (issue 37): a load of the newest step with saves, GC,
archive and pins fired at a generated point of its read; invariant (g) around it.

The point is generated, not timed: the loader's storage (RaceStorage) runs the generated
actions right before its `at`-th read of a file of one `kind` (a commit marker, a manifest, an
object), so one sequence replays the same race every time.
"""

from __future__ import annotations

from ckptflow.steps.checkpoint import Checkpointer
from hypothesis import strategies as st
from hypothesis.stateful import rule

from ckptflow.core import layout, runroot
from tests.faults.adversary.machine import has, note
from tests.faults.adversary.storage import RaceStorage
from tests.faults.adversary.truth import (
    FalseDamage,
    NewestLost,
    WrongBytes,
    check_api_error,
    diff,
    zeros_like,
)

# What runs while a load reads, in this order: the oldest committed step is pinned (the older
# step a wrong fallback finds), a trainer commits steps (new data, or all of it deduplicated),
# then a deleter: GC keeping the newest 1 or 2, or archive moving every older step.
DELETERS = ("gc last=1", "gc last=2", "archive")


class RaceRules:
    """Mixin of the state machine (machine.Machine)."""

    @has("races")
    @rule(
        kind=st.sampled_from(["COMMIT", "manifest", "object"]),
        at=st.integers(0, 4),
        pin=st.booleans(),
        saves=st.lists(st.sampled_from(["save", "save same"]), max_size=2),
        deleter=st.sampled_from([*DELETERS, None]),
    )
    def load_racing_deleters(
        self, kind: str, at: int, pin: bool, saves: list[str], deleter: str | None
    ) -> None:
        """Invariant (g): a load of the newest valid step, while `actions` run right before its
        `at`-th read of a `kind` file, returns the newest intact step there was when it began or
        a newer one (bytes as saved: (a)), and reports no step intact then as damaged."""
        self._op("load_racing_deleters")
        actions = ["pin oldest"] * pin + saves + ([deleter] if deleter else [])
        self.probe.clear()
        intact = {s for s in self.truth.saved if self.truth.intact(s)}
        newest = max(intact, default=None)
        racing = RaceStorage(self.roots.hot, at, {kind}, lambda: self._race(actions))
        loader = Checkpointer("unused", storage=racing, threads=2)
        target = zeros_like(self.state)
        what = f"load() with {actions} before its read {at} of a {kind}"
        try:
            got = loader.load(target)
        except AssertionError:
            raise
        except BaseException as exc:
            check_api_error(what, exc, self.roots.all())
            if newest is not None:
                raise NewestLost(
                    f"{what} failed although step {newest} was intact: {exc}"
                ) from None
            return
        finally:
            loader.close()
        self.stats.rules["race fired" if racing.fired else "race not reached"] += 1
        rec = self.truth.saved.get(got)
        if rec is None:
            raise WrongBytes(f"{what} returned step {got}, which no save committed")
        d = diff(rec.state, target)
        if d:
            raise WrongBytes(f"{what} returned step {got} with {d}")
        if newest is not None and got < newest:
            raise NewestLost(f"{what} returned step {got}, older than the intact step {newest}")
        false = [s for s, _ in loader.last_load.fell_back_from if s in intact]
        if false:
            raise FalseDamage(
                f"{what} reported steps {false} as damaged, which were intact when it began: "
                f"{loader.last_load.fell_back_from}"
            )

    def _race(self, actions: list[str]) -> None:
        """Run `actions` (in the loader's read, which waits for them)."""
        note(f"race: {actions}")
        for action in actions:
            if action.startswith("save"):
                self._save(True, "same" if action == "save same" else "new", 1)
            elif action.startswith("gc"):
                self.gc(keep=int(action.rsplit("=", 1)[1]), grace="0")
            elif action == "archive":
                self.archive(to="archive root", grace="0")
            else:
                self._pin_oldest()

    def _pin_oldest(self) -> None:
        committed = self._committed_hot()
        if not committed:
            return
        step = committed[0]
        runroot.pin(self.stores["hot"], step, "adversary race")
        self.probe.clear()
        self.truth.pins[step] = self.probe.digest("hot", f"{layout.step_dir(step)}/{runroot.PIN}")
        self.dirty = True

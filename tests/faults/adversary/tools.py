"""The adversary's tool rules: `ckptflow ckpt` ls / verify / pin / unpin / gc / archive, GC
while a save is in flight, an archive that dies at a write, an evaluator; and invariants (c),
(d) and (f) around them."""

from __future__ import annotations

import json
import re
import time

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from ckptflow.core import archive as archive_mod
from ckptflow.core import layout, runroot
from ckptflow.core.storage import StorageError
from tests.faults.adversary import damage
from tests.faults.adversary.machine import PICK, has, note
from tests.faults.adversary.storage import AdversaryStorage, Countdown, SimulatedCrash
from tests.faults.adversary.truth import ABSENT, NeededDeleted, Undetected, check_api_error


class ToolRules:
    """Mixin of the state machine (machine.Machine)."""

    # -- tools -----------------------------------------------------------------------------------
    @has()
    @rule(cmd=st.sampled_from(["ls", "ls --verify", "verify"]))
    def inspect(self, cmd: str) -> None:
        """`ckpt ls`, `ls --verify` or `verify`: invariants (d) and (f)."""
        if cmd == "verify":
            self._verify()
        else:
            self._ls(cmd.endswith("verify"))

    def _ls(self, deep: bool) -> None:
        """(f): a row is never `committed` when an object it needs is missing or of the wrong
        size (or, with --verify, of other content)."""
        self._op("ls")
        rc, out, _ = self._cli(
            "ckpt", "ls", self.roots.hot, "--json", *(["--verify"] if deep else [])
        )
        if rc != 0:
            return
        self.probe.clear()
        for row in json.loads(out):
            s = row["step"]
            if row["state"] == "committed" and s in self.truth.saved:
                bad = self.truth.object_damage(s, deep)
                if bad:
                    raise Undetected(
                        f"`ckpt ls{' --verify' if deep else ''}` calls step {s} committed: {bad}"
                    )

    def _verify(self) -> None:
        """(f): `verify` never says `ok` for a step with a damaged object."""
        self._op("verify")
        rc, out, _ = self._cli("ckpt", "verify", self.roots.hot)
        self.probe.clear()
        for m in re.finditer(r"^step (\d+): ok", out, re.M):
            s = int(m[1])
            if s in self.truth.saved and self.truth.object_damage(s, deep=True):
                raise Undetected(
                    f"`ckpt verify` says step {s} is ok: {self.truth.object_damage(s, True)}"
                )

    @has()
    @rule(pick=PICK, pin=st.booleans())
    def pin(self, pick: int, pin: bool) -> None:
        self._op("pin" if pin else "unpin")
        step = self._step_or_none(pick)
        if step is None:
            return
        if pin:
            rc, _, _ = self._cli("ckpt", "pin", self.roots.hot, str(step), "--reason", "adversary")
            if rc == 0:
                self.probe.clear()
                self.truth.pins[step] = self.probe.digest(
                    "hot", f"{layout.step_dir(step)}/{runroot.PIN}"
                )
        else:
            rc, _, _ = self._cli("ckpt", "unpin", self.roots.hot, str(step))
            if rc == 0:
                self.truth.pins.pop(step, None)
        self.dirty = True

    @has("json")
    @rule(pick=PICK, loss=st.floats(0, 10))
    def evaluate(self, pick: int, loss: float) -> None:
        """An evaluator records metrics for a step (eval.json, which damage may then hit), as
        ckptflow.steps.evaluate does, through Storage: a refusal is fine (the folder may be
        damaged), a wrong reason is not (d)."""
        self._op("evaluate")
        step = self._step_or_none(pick)
        if step is None:
            return
        doc = {"step": step, "metrics": {"loss": loss}, "evaluated_at": time.time()}
        rel = f"{layout.step_dir(step)}/{runroot.EVAL}"
        try:
            self.stores["hot"].write(rel, json.dumps(doc).encode())
        except (OSError, StorageError) as exc:
            check_api_error(f"writing {rel}", exc, self.roots.all())
            note(f"the evaluator could not write {rel}: {exc}")
        self.dirty = True

    @has("gc")
    @rule(keep=st.sampled_from([1, 2, 3]), grace=st.sampled_from(["0", "1h"]))
    def gc(self, keep: int, grace: str) -> None:
        self._op("gc")
        expect = self._gc_expect(keep)
        self._cli(
            "ckpt", "gc", self.roots.hot, "--policy", f"last={keep}", "--grace", grace, "--yes"
        )
        self._gc_check(expect, f"gc --policy last={keep} --grace {grace}")

    @has("inflight")
    @rule(
        phase=st.sampled_from(["manifest", "COMMIT"]),
        keep=st.sampled_from([1, 2]),
        grace=st.sampled_from(["0", "1h"]),
    )
    def gc_during_save(self, phase: str, keep: int, grace: str) -> None:
        """GC runs while an async save is held just before writing its manifest (or COMMIT);
        the save then goes on. Invariant (e) holds for the save if it reports success."""
        self._op("gc_during_save")

        def during() -> None:
            expect = self._gc_expect(keep)
            self._cli(
                "ckpt", "gc", self.roots.hot, "--policy", f"last={keep}", "--grace", grace, "--yes"
            )
            self._gc_check(expect, f"gc --grace {grace} during a save held before its {phase}")

        self._save(False, "new", 1, hold=phase, during=during)

    def _gc_expect(self, keep: int) -> tuple[set[int], dict[int, str]]:
        """The data-intact steps, and those of them that GC under last=`keep` must keep: the
        newest (unless a newer step still loads exactly), any with fewer than `keep` committed
        folders above it (whatever the tool thinks of those), ones we pinned, and their bases."""
        t = self.truth
        self.probe.clear()
        intact = {s for s in t.saved if t.data_intact(s)}
        committed = self._committed_hot()
        must: dict[int, str] = {}
        if intact:
            newest = max(intact)
            newer = [c for c in committed if c > newest and self._load(c, must=False) is not None]
            if not newer:
                must[newest] = "the newest intact step"
        for s in sorted(intact):
            if sum(c > s for c in committed) < keep:
                must.setdefault(s, f"last={keep}")
            pin = self.probe.digest("hot", f"{layout.step_dir(s)}/{runroot.PIN}")
            if t.pins.get(s) == pin:
                must.setdefault(s, "pinned")
        todo = list(must)
        while todo:
            base = t.saved[todo.pop()].base_step
            if base in intact and base not in must:
                must[base] = "base of a kept delta"
                todo.append(base)
        return intact, must

    def _gc_check(self, expect: tuple[set[int], dict[int, str]], what: str) -> None:
        """Invariant (c) after a GC."""
        intact, must = expect
        self.probe.clear()
        self.dirty = True
        for s, why in sorted(must.items()):
            bad = self.truth.bad_deps(s)
            if bad:
                raise NeededDeleted(
                    f"`{what}` broke step {s}, which it must keep ({why}): {bad[:5]}"
                )
        for s in sorted(intact - set(must)):
            commit = ("hot", layout.commit_path(s))
            rec = self.truth.saved[s]
            if self.probe.digest(*commit) == rec.deps[commit] and self.truth.bad_deps(s):
                raise NeededDeleted(
                    f"`{what}` left step {s} committed but without files it needs: "
                    f"{self.truth.bad_deps(s)[:5]}"
                )

    @has("archive")
    @rule(
        to=st.sampled_from(["archive root", "symlink alias", "double-slash alias"]),
        grace=st.sampled_from(["0", "1h"]),
    )
    def archive(self, to: str, grace: str) -> None:
        """`ckpt archive --older-than 0` to the archive root or to another spelling of the hot
        root itself; invariant (c): every data-intact step stays whole, wherever it now is."""
        self._op("archive")
        dest = self.roots.aliases.get(to, self.roots.arch)
        before = self._archive_before()
        self._cli(
            "ckpt",
            "archive",
            self.roots.hot,
            "--older-than",
            "0",
            "--to",
            dest,
            "--grace",
            grace,
            "--yes",
        )
        self._archive_check(before, f"archive --to {to} --grace {grace}")

    @has("archive")
    @precondition(lambda self: "crash" in self.groups)
    @rule(
        after=st.integers(0, 3),
        grace=st.sampled_from(["0", "1h"]),
        at=st.sampled_from(
            [None, "root marker", "object", "manifest", "COMMIT", "ARCHIVED", "delete"]
        ),
    )
    def crash_archive(self, after: int, grace: str, at: str | None) -> None:
        """An archive run that dies at its `after`-th write (or delete) of kind `at` (None: any),
        in the hot or the archive root."""
        self._op("crash_archive")
        countdown = Countdown(after, at)
        hot, dst = (
            AdversaryStorage(self.roots.hot, countdown),
            AdversaryStorage(self.roots.arch, countdown),
        )
        before = self._archive_before()
        try:
            archive_mod.archive(
                self.roots.hot,
                self.roots.arch,
                0.0,
                apply=True,
                grace_s=0.0 if grace == "0" else 3600.0,
                storage=hot,
                dest=dst,
            )
        except SimulatedCrash as exc:
            note(f"archive died at {exc}")
        except BaseException as exc:
            check_api_error("archive", exc, self.roots.all())
        self._archive_check(before, f"archive that dies at its write {after} of kind {at}")

    def _archive_before(self) -> set[int]:
        self.probe.clear()
        return {s for s in self.truth.saved if self.truth.data_intact(s)}

    def _archive_check(self, intact: set[int], what: str) -> None:
        self.probe.clear()
        self.dirty = True
        for s in sorted(intact):
            rec = self.truth.saved[s]
            marker = ("hot", f"{layout.step_dir(s)}/{layout.ARCHIVED}")
            if rec.deps.get(marker) != ABSENT or self.probe.digest(*marker) == ABSENT:
                continue
            uri = (damage.parse(self.probe.blob(*marker)) or {}).get("uri")
            where = (
                "arch"
                if uri == self.roots.arch
                else "hot"
                if uri in self.roots.aliases.values()
                else None
            )
            note(f"step {s} archived to {uri}")
            if where is not None:
                self.truth.adopt_archived(s, where)
        self.probe.clear()
        for s in sorted(intact):
            bad = self.truth.bad_deps(s)
            if bad:
                raise NeededDeleted(f"`{what}` broke the intact step {s}: {bad[:5]}")

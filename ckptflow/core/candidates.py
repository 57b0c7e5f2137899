"""Which step a load of the newest valid step reads next, while saves and deleters race it.

A load lists the committed steps once and tries them newest first. Meanwhile a trainer may
commit a newer step and GC or retention delete the one being read (GC deletes COMMIT first,
then the step's files and the objects no kept step references), and archive may move it to its
archive root and free its hot objects. Each of these makes a read find a file missing. Read as
damage, it sent the load back to an older (pinned) step although a newer intact step was
committed (issue 37, defect 2). The rule here, applied after every failed step:

* the committed steps are listed again, and the next candidates are those not tried yet,
  newest first: a step committed since the load began is tried before any older one;
* a step no longer committed was deleted under the read: that is not damage, and it is not
  reported (`deleted`, not `fell_back`);
* a step still committed whose read found a file missing (FileMissing) is tried once more (it
  may have been archived: it is read from its new place); missing again, it is damaged;
* any other failure of a step still committed is damage (`fell_back`, with the reason).

Bounded: a root whose steps change under the read more than MAX_CHANGES times is an error
naming the fix, never an endless load.
"""

from __future__ import annotations

from collections.abc import Callable

from ckptflow.core.errors import CheckpointError, FileMissing, NotCommitted

MAX_CHANGES = 16


class Candidates:
    """The steps to try, newest first; `failed` re-resolves them after a step's read failed."""

    def __init__(self, root: str, list_steps: Callable[[], list[int]]):
        self.root = root
        self._list = list_steps
        self.queue = sorted(list_steps(), reverse=True)
        self.tried: set[int] = set()
        self.retried: set[int] = set()
        self.fell_back: list[tuple[int, str]] = []  # (step, why): damaged steps skipped
        self.deleted: list[int] = []  # steps deleted (or moved) while they were read
        self.changes = 0

    def next(self) -> int | None:
        """The next step to try; None when none is left."""
        if not self.queue:
            return None
        step = self.queue.pop(0)
        self.tried.add(step)
        return step

    def failed(self, step: int, exc: BaseException) -> str:
        """Record the failure of `step` and re-resolve the candidates; returns what it was:
        "deleted", "retry" or "damaged"."""
        now = sorted(self._list())
        if step not in now:
            self.deleted.append(step)
            what = "deleted"
        elif isinstance(exc, (FileMissing, NotCommitted)) and step not in self.retried:
            self.retried.add(step)
            self.tried.discard(step)
            what = "retry"
        else:
            self.fell_back.append((step, str(exc)))
            what = "damaged"
        newer = [s for s in now if s > step and s not in self.tried]
        if what != "damaged" or newer:
            self.changes += 1
            if self.changes > MAX_CHANGES:
                raise CheckpointError(
                    f"the committed steps under {self.root} changed {self.changes} times while "
                    "a load read them (saves and GC faster than a load); pin the step to load "
                    "(`ckptflow ckpt pin`) or load it by number"
                )
        self.queue = sorted((s for s in now if s not in self.tried), reverse=True)
        return what

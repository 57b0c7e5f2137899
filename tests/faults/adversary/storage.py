"""Storage for the adversary: a Storage that holds a write or dies at one, and the roots of
an example (hot, archive, aliases of the hot root, another run's root, a root that is nowhere).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import uuid
from dataclasses import dataclass

from ckptflow.steps.checkpoint import Checkpointer

from ckptflow.core import layout, runroot
from ckptflow.core.storage import Storage
from tests.faults.adversary import damage
from tests.faults.adversary.truth import make_state


class SimulatedCrash(BaseException):
    """The process died at this write (a BaseException: nothing in the engine catches it)."""


# -- storage the machine can stop or kill ----------------------------------------------------------
def file_kind(rel: str) -> str:
    """What a stored file is: object, manifest, intent, COMMIT, ARCHIVED, PIN, eval, root marker."""
    name = rel.rsplit("/", 1)[-1]
    if rel.startswith(layout.OBJECTS + "/"):
        return "object"
    if name == layout.ROOT_MARKER:
        return "root marker"
    for prefix, kind in (("manifest-", "manifest"), ("saving-", "intent")):
        if name.startswith(prefix):
            return kind
    return {runroot.EVAL: "eval"}.get(name, name)


class Countdown:
    """Writes (or deletes) of one kind (`file_kind`, "delete", or None: any) left before a
    simulated crash; shared by the storages of one tool."""

    def __init__(self, left: int | None = None, kind: str | None = None):
        self.left, self.kind = left, kind
        self.lock = threading.Lock()

    def tick(self, kind: str) -> bool:
        """True when this write (of `kind`) is the one that dies."""
        with self.lock:
            if self.left is None or self.kind not in (None, kind):
                return False
            if self.left == 0:
                self.left = None
                return True
            self.left -= 1
            return False


def _bytes(data) -> bytes:
    if isinstance(data, list):
        return b"".join(memoryview(c).cast("B").tobytes() for c in data)
    return bytes(data)


class AdversaryStorage(Storage):
    """A Storage that holds one write until released (`hold`: a save in flight for as long as
    the machine wants) or dies at the N-th write (`countdown`): a local in-place write then
    leaves the first half of its bytes, an exclusive create (hard-linked into place) or an
    S3 PUT (atomic) leaves nothing."""

    def __init__(self, uri: str, countdown: Countdown | None = None):
        super().__init__(uri)
        self.countdown = countdown or Countdown()
        self.hold_phase: str | None = None
        self.reached, self.release = threading.Event(), threading.Event()

    def hold(self, phase: str) -> None:
        self.hold_phase = phase
        self.reached.clear()
        self.release.clear()

    def write(self, rel, data, *, exclusive=False, **kw):
        if self.hold_phase is not None and file_kind(rel) == self.hold_phase:
            self.hold_phase = None
            self.reached.set()
            self.release.wait(60)
        if self.countdown.tick(file_kind(rel)):
            if self.protocol == "file" and not exclusive:
                super().write(rel, damage.torn(_bytes(data)), **kw)
            raise SimulatedCrash(rel)
        super().write(rel, data, exclusive=exclusive, **kw)

    def delete(self, rels):
        for rel in rels:
            if self.countdown.tick("delete"):
                raise SimulatedCrash(rel)
            super().delete([rel])


class RaceStorage(Storage):
    """A Storage that runs `action` once, right before its `at`-th read (0-based) of a file of
    one of `kinds` (`file_kind`): a reader racing a writer or a deleter at a chosen point of
    its read, deterministically. Local objects are read through the filesystem, not `read`:
    their hook is the fingerprint the reader takes right before each (ObjectFetcher)."""

    def __init__(self, uri: str, at: int, kinds, action):
        super().__init__(uri)
        self.at, self.kinds, self.action = at, frozenset(kinds), action
        self.seen = 0
        self.fired = False
        self.lock = threading.Lock()

    def _tick(self, rel: str) -> None:
        if file_kind(rel) not in self.kinds:
            return
        with self.lock:
            fire = not self.fired and self.seen == self.at
            self.seen += 1
            self.fired = self.fired or fire
        if fire:
            self.action()

    def read(self, rel, limit=None):
        self._tick(rel)
        return super().read(rel, limit)

    def fingerprint(self, rel):
        self._tick(rel)
        return super().fingerprint(rel)


# -- roots -----------------------------------------------------------------------------------------
@dataclass
class Roots:
    """The URIs one example works on."""

    hot: str
    arch: str
    aliases: dict[str, str]  # another spelling of the hot root -> its URI
    foreign: str  # a root of another run (read only)
    nowhere: str  # a root that does not exist
    base: str | None = None  # local folder to remove afterwards

    def all(self) -> list[str]:
        return [self.hot, self.arch, *self.aliases.values(), self.foreign, self.nowhere]


_FOREIGN: dict[str, str] = {}
FOREIGN_STEPS = 60


def foreign_root() -> str:
    """A local root of another run with steps 1..FOREIGN_STEPS (made once per session)."""
    if "root" not in _FOREIGN:
        base = tempfile.mkdtemp(prefix="ckptflow-adv-foreign-")
        atexit.register(shutil.rmtree, base, True)
        root = os.path.join(base, "ckpt")
        ck = Checkpointer(root, threads=2)
        for s in range(1, FOREIGN_STEPS + 1):
            ck.save(s, make_state(5000 + s, 5000 + s, "plain") | {"step": s})
        ck.close()
        _FOREIGN["root"] = root
    return _FOREIGN["root"]


def make_roots(backend: str, bucket: str | None) -> Roots:
    if backend == "local":
        base = tempfile.mkdtemp(prefix="ckptflow-adv-")
        os.makedirs(os.path.join(base, "hot"))
        os.symlink(os.path.join(base, "hot"), os.path.join(base, "link"))
        hot = os.path.join(base, "hot", "ckpt")
        aliases = {
            "symlink alias": os.path.join(base, "link", "ckpt"),
            "double-slash alias": "/" + hot,
        }
        return Roots(
            hot,
            os.path.join(base, "arch", "ckpt"),
            aliases,
            foreign_root(),
            os.path.join(base, "nowhere", "ckpt"),
            base,
        )
    prefix = f"s3://{bucket}/{uuid.uuid4().hex[:12]}"
    return Roots(f"{prefix}/hot", f"{prefix}/arch", {}, foreign_root(), f"{prefix}/nowhere")

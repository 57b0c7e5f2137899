"""Ground truth for the adversary (tests/faults/adversary/): what was saved and what it needs.

For every step a save committed, the model keeps its exact state dict and the files it depends
on, each with the digest it had at commit time: COMMIT, the manifest COMMIT names, the absence
of an ARCHIVED marker (or, once archived, that marker and the archive copy), every object the
manifest references (content-addressed: the digest must equal the key), and the root marker
(of the hot root, and of the archive root once archived). Intactness is read from the storage
itself, never from the engine: a step is *data-intact* when every file it depends on except the
root markers still has exactly its commit-time bytes, and *intact* when the root markers are
unchanged as well. This is conservative: any byte changed in anything a step needs (a harmless
timestamp digit too) makes it not intact, so the model only ever demands too little.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import traceback
from dataclasses import dataclass, field

import torch

from ckptflow.core import codec, layout
from ckptflow.core.storage import Storage
from ckptflow.core.storage_errors import StorageError

ABSENT = "<absent>"
UNREADABLE = "<unreadable>"


# -- the invariants, one exception type each (hypothesis reports distinct ones separately) --------
class Violation(AssertionError):
    """An invariant of the adversarial model does not hold."""

    code = "?"

    def __init__(self, message: str):
        super().__init__(f"invariant ({self.code}) violated: {message}")


class WrongBytes(Violation):
    code = "a"  # a load returned bytes other than those saved for the step it reports


class NewestLost(Violation):
    code = "b"  # the newest intact step is not loadable or not listed


class NeededDeleted(Violation):
    code = "c"  # gc/archive removed or broke a file an intact step needs


class NotClean(Violation):
    code = "d"  # a tool crashed, printed a traceback, or failed without naming a file


class BadSave(Violation):
    code = "e"  # a save reported success but its step is not intact, or orphans intact steps


class Undetected(Violation):
    code = "f"  # verify/ls called a step sound although an object it needs is damaged


class FalseDamage(Violation):
    code = "g"  # a load racing saves and deleters reported a step intact when it began as damaged


# -- state dicts -----------------------------------------------------------------------------------
def make_state(seed: int, frozen: int, names: str) -> dict:
    """A tiny state dict: a 2x3 and a 3-element float tensor that change with `seed`, a frozen
    tensor and an integer tensor that change with `frozen` only (deduplicated), plain values.
    `names="colliding"` adds a 1-D tensor `a` and a value named `a@0` (its item key)."""
    g = torch.Generator().manual_seed(seed)
    f = torch.Generator().manual_seed(10_000 + frozen)
    state = {
        "w": torch.randn(2, 3, generator=g),
        "bias": torch.randn(3, generator=g),
        "frozen": torch.randn(4, generator=f),
        "ids": torch.arange(3) * (frozen + 1),
        "step": seed,
        "sched": {"lr": 0.5, "name": "cosine"},
    }
    if names == "colliding":
        state["a"] = torch.randn(2, generator=g)
        state["a@0"] = seed
    return state


def clone(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: clone(v) for k, v in obj.items()}
    return json.loads(json.dumps(obj))


def zeros_like(obj, dtype: torch.dtype | None = None):
    """A load target of the same structure: tensors zeroed (optionally of another float dtype),
    values replaced by None."""
    if isinstance(obj, torch.Tensor):
        want = dtype if dtype is not None and obj.is_floating_point() else obj.dtype
        return torch.zeros(obj.shape, dtype=want)
    if isinstance(obj, dict):
        return {k: zeros_like(v, dtype) for k, v in obj.items()}
    return None


def diff(saved, loaded, path: str = "") -> str | None:
    """Where `loaded` differs from `saved` bit for bit (dtype, shape, bytes, values), or None."""
    if isinstance(saved, torch.Tensor):
        if not isinstance(loaded, torch.Tensor):
            return f"{path}: a tensor was saved, {type(loaded).__name__} loaded"
        if saved.dtype != loaded.dtype or saved.shape != loaded.shape:
            was, got = f"{saved.dtype}{list(saved.shape)}", f"{loaded.dtype}{list(loaded.shape)}"
            return f"{path}: saved {was}, loaded {got}"
        a = saved.contiguous().reshape(-1).view(torch.uint8)
        b = loaded.contiguous().reshape(-1).view(torch.uint8)
        return (
            None
            if torch.equal(a, b)
            else f"{path}: other bytes ({loaded.tolist()} != {saved.tolist()})"
        )
    if isinstance(saved, dict):
        if not isinstance(loaded, dict) or set(saved) != set(loaded):
            return f"{path}: keys differ"
        for k in saved:
            d = diff(saved[k], loaded[k], f"{path}.{k}" if path else k)
            if d:
                return d
        return None
    return None if saved == loaded else f"{path}: saved {saved!r}, loaded {loaded!r}"


# -- reading the storage ---------------------------------------------------------------------------
class Probe:
    """Digests and sizes of stored files, read once per model check (a cache the machine clears
    after every operation)."""

    def __init__(self, stores: dict[str, Storage]):
        self.stores = stores
        self._cache: dict[tuple[str, str], tuple[str, int | None]] = {}

    def clear(self) -> None:
        self._cache.clear()

    def _get(self, root: str, rel: str) -> tuple[str, int | None]:
        if (root, rel) not in self._cache:
            try:
                blob = self.stores[root].read(rel)
                self._cache[root, rel] = (codec.digest(blob), len(blob))
            except FileNotFoundError:
                self._cache[root, rel] = (ABSENT, None)
            except (OSError, StorageError):  # a folder where the file was: StorageError now
                self._cache[root, rel] = (UNREADABLE, None)
        return self._cache[root, rel]

    def digest(self, root: str, rel: str) -> str:
        return self._get(root, rel)[0]

    def size(self, root: str, rel: str) -> int | None:
        return self._get(root, rel)[1]

    def blob(self, root: str, rel: str) -> bytes | None:
        try:
            return self.stores[root].read(rel)
        except (OSError, StorageError):
            return None


@dataclass
class Saved:
    """A step as its save committed it, and everything it needs (see the module doc)."""

    step: int
    state: dict  # the exact state dict saved
    kind: str  # "full" or "delta"
    base_step: int | None
    root_id: str
    deps: dict[tuple[str, str], str]  # (root, path) -> digest (objects: their key), or ABSENT
    sizes: dict[tuple[str, str], int]  # object deps -> stored size
    identity: set[tuple[str, str]]  # the step's own markers: COMMIT, manifest, ARCHIVED
    markers: dict[str, str]  # root -> digest of its root marker
    location: str = "hot"  # "hot" or "arch": where its objects live


@dataclass
class Truth:
    """Every saved step and pin, checked against the storage through a Probe."""

    probe: Probe
    saved: dict[int, Saved] = field(default_factory=dict)
    pins: dict[int, str] = field(default_factory=dict)  # step -> digest of the PIN we wrote
    marker_blobs: dict[str, bytes] = field(default_factory=dict)  # digest -> root marker

    def record(self, step: int, state: dict) -> Saved | None:
        """The step a save just committed, read back from the hot root (None: no COMMIT)."""
        p = self.probe
        commit_rel = layout.commit_path(step)
        commit = _json(p.blob("hot", commit_rel))
        if not isinstance(commit, dict):
            return None
        mrel = f"{layout.step_dir(step)}/{layout.manifest_name(str(commit.get('save_id')))}"
        m = _json(p.blob("hot", mrel))
        if not isinstance(m, dict) or not isinstance(m.get("objects"), dict):
            return None
        arch_rel = f"{layout.step_dir(step)}/{layout.ARCHIVED}"
        deps = {
            ("hot", commit_rel): p.digest("hot", commit_rel),
            ("hot", mrel): p.digest("hot", mrel),
            ("hot", arch_rel): ABSENT,
        }
        sizes = {}
        for key, rec in m["objects"].items():
            deps["hot", layout.object_path(key)] = key
            sizes["hot", layout.object_path(key)] = rec.get("size")
        marker = p.blob("hot", layout.ROOT_MARKER)
        if marker is not None:
            self.marker_blobs[codec.digest(marker)] = marker
        rec = Saved(
            step=step,
            state=state,
            kind=str(m.get("kind")),
            base_step=m.get("base_step"),
            root_id=str(m.get("root_id")),
            deps=deps,
            sizes=sizes,
            identity={("hot", commit_rel), ("hot", mrel), ("hot", arch_rel)},
            markers={"hot": p.digest("hot", layout.ROOT_MARKER)},
        )
        self.saved[step] = rec
        return rec

    def adopt_archived(self, step: int, location: str) -> None:
        """An archive run moved `step` to `location` ("arch", or "hot" for an alias of the hot
        root): its objects, COMMIT and manifest are expected there, byte for byte."""
        rec, p = self.saved[step], self.probe
        arch_rel = f"{layout.step_dir(step)}/{layout.ARCHIVED}"
        hot = {k: v for k, v in rec.deps.items() if not k[1].startswith(layout.OBJECTS + "/")}
        hot["hot", arch_rel] = p.digest("hot", arch_rel)
        deps, sizes = dict(hot), {}
        for (_, rel), digest in rec.deps.items():
            if rel.startswith(layout.OBJECTS + "/"):
                deps[location, rel] = digest
                sizes[location, rel] = rec.sizes[rec.location, rel]
            elif rel != arch_rel:
                deps[location, rel] = digest  # the copy of COMMIT and manifest
        rec.deps, rec.sizes, rec.location = deps, sizes, location
        rec.identity = {k for k in deps if not k[1].startswith(layout.OBJECTS + "/")}
        if location != "hot":
            rec.markers[location] = p.digest(location, layout.ROOT_MARKER)

    # -- judgments ---------------------------------------------------------------------------
    def bad_deps(self, step: int) -> list[str]:
        rec = self.saved[step]
        out = []
        for (root, rel), want in sorted(rec.deps.items()):
            have = self.probe.digest(root, rel)
            if have == want:
                continue
            what = "missing" if have == ABSENT else ("present" if want == ABSENT else "changed")
            size, expected = self.probe.size(root, rel), rec.sizes.get((root, rel))
            if what == "changed" and expected is not None:
                same = size == expected
                what = "changed, same size" if same else f"changed, {size} bytes, not {expected}"
            out.append(f"{root}:{rel} {what}")
        return out

    def data_intact(self, step: int) -> bool:
        return step in self.saved and not self.bad_deps(step)

    def markers_intact(self, step: int) -> bool:
        rec = self.saved[step]
        return all(self.probe.digest(r, layout.ROOT_MARKER) == d for r, d in rec.markers.items())

    def intact(self, step: int) -> bool:
        return self.data_intact(step) and self.markers_intact(step)

    def newest(self, pred) -> int | None:
        return max((s for s in self.saved if pred(s)), default=None)

    def object_damage(self, step: int, deep: bool) -> list[str]:
        """Objects of a step whose own markers are untouched that are missing, of the wrong size
        or (deep) of other content: damage every check of that kind must find."""
        rec = self.saved[step]
        if any(self.probe.digest(*k) != rec.deps[k] for k in rec.identity):
            return []  # the step's markers changed: it may name other objects now
        bad = []
        for k, size in sorted(rec.sizes.items()):
            have_size = self.probe.size(*k)
            if have_size is None or have_size != size:
                bad.append(f"{k[0]}:{k[1]} ({'missing' if have_size is None else 'size'})")
            elif deep and self.probe.digest(*k) != rec.deps[k]:
                bad.append(f"{k[0]}:{k[1]} (content)")
        return bad


def _json(blob: bytes | None):
    try:
        return json.loads(blob) if blob is not None else None
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None


# -- tools -----------------------------------------------------------------------------------------
def _where(exc: BaseException) -> str:
    """`Type: message` and the innermost ckptflow frame that raised it (for the report)."""
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if "/ckptflow/" in f.filename or "/steps/" in f.filename
    ]
    at = ""
    if frames:
        f = frames[-1]
        path = (
            f.filename[f.filename.rfind("/ckptflow/") + 1 :]
            if "/ckptflow/" in f.filename
            else f.filename
        )
        at = f" at {path.split('/wt-adversary/')[-1]}:{f.lineno} in {f.name}()"
    return f"{type(exc).__name__}: {str(exc)[:200]}{at}"


def run_cli(argv: list[str], roots: list[str]) -> tuple[int, str, str]:
    """Run `ckptflow <argv>` in this process with captured output. Invariant (d): it returns
    0, 1 or 2, prints no traceback, and an error names a file (one of the roots' paths)."""
    from ckptflow.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argv)
    except BaseException as exc:  # what a user would see as a traceback
        raise NotClean(f"`ckptflow {' '.join(argv)}` crashed: {_where(exc)}") from None
    text = out.getvalue() + err.getvalue()
    if rc not in (0, 1, 2) or "Traceback (most recent call last)" in text:
        raise NotClean(f"`ckptflow {' '.join(argv)}` exited {rc}:\n{text[-2000:]}")
    if rc != 0 and not any(r in text for r in roots):
        raise NotClean(f"`ckptflow {' '.join(argv)}` exited {rc} naming no file:\n{text[-2000:]}")
    if rc != 0 and _false_exists(text):
        raise NotClean(f"`ckptflow {' '.join(argv)}` exited {rc}: {_false_exists(text)}")
    return rc, out.getvalue(), err.getvalue()


def _false_exists(text: str) -> str | None:
    """An 'X already exists' error for a file that is never created exclusively (only COMMIT
    and root markers are): some other failure (a file where a folder belongs, say) was
    classified by its type or text as a lost race."""
    for m in re.finditer(r"(\S+) already exists", text):
        name = m[1].rsplit("/", 1)[-1]
        if name not in (layout.COMMIT, layout.ROOT_MARKER):
            return f"says {m[1]} already exists, but nothing creates it exclusively"
    return None


def check_api_error(op: str, exc: BaseException, roots: list[str]) -> None:
    """Invariant (d) for the Python API: a failure is a CheckpointError or StorageError whose
    message names a file."""
    from ckptflow.core.errors import CheckpointError
    from ckptflow.core.storage import StorageError

    if not isinstance(exc, CheckpointError | StorageError):
        raise NotClean(f"{op} raised {_where(exc)}, not a CheckpointError") from None
    if not any(r in str(exc) for r in roots):
        raise NotClean(f"{op} failed naming no file: {exc}") from None
    if _false_exists(str(exc)):
        raise NotClean(f"{op} failed: {_false_exists(str(exc))} ({type(exc).__name__})") from None

"""`synchronization` on one machine: Argo's mutexes and semaphores as file locks.

In Argo the controller holds these locks for every workflow of a namespace; here every run on
this machine shares one lock directory (default `<tmp>/ckptflow-runner-locks`), so two
`ckptflow run` processes exclude each other as two workflows of one namespace would:

- a mutex `NAME` is an exclusive `flock` on `<dir>/<namespace>/mutex/NAME`;
- a semaphore is N lock files `<dir>/<namespace>/semaphore/NAME/<i>`, one held per holder. Its
  limit lives in a ConfigMap in Argo; here the caller gives it (`ckptflow run --semaphore
  NAME=N`, or a ConfigMap manifest with `--semaphore-config FILE`), where NAME is
  `<configmap>/<key>` for `configMapKeyRef` and the key of a `database` semaphore. A semaphore
  without a limit is refused before anything runs.

`database: true` mutexes (shared by several controllers in Argo) are machine-wide mutexes here.
A node waiting for a lock stays Pending with Argo's message ("Waiting for ... lock").
Locks are released when the template (or, at workflow level, the workflow) ends, also when the
process dies: the kernel drops a dead process's flocks.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "DEFAULT_LOCK_DIR",
    "hold",
    "limits_from_configmap",
    "parse_limit",
    "sync_problems",
    "wanted",
]

DEFAULT_LOCK_DIR = os.path.join(tempfile.gettempdir(), "ckptflow-runner-locks")
_NAME = re.compile(r"^[\w.{}\s/-]{1,253}$")


def parse_limit(text: str) -> tuple[str, int]:
    """`NAME=N` of `--semaphore`; raises ValueError naming the fix."""
    name, sep, value = text.partition("=")
    if not sep or not name or not value.strip().isdigit() or int(value) < 1:
        raise ValueError(f"--semaphore {text!r}: expected NAME=N with N >= 1 (NAME: configmap/key)")
    return name.strip(), int(value)


def limits_from_configmap(path: str) -> dict[str, int]:
    """Semaphore limits from a ConfigMap manifest: `<metadata.name>/<key>` -> int(data[key])."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"--semaphore-config {path}: cannot read it: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("kind") != "ConfigMap":
        raise ValueError(f"--semaphore-config {path}: expected a ConfigMap manifest")
    name = (doc.get("metadata") or {}).get("name")
    data = doc.get("data") or {}
    if not name or not isinstance(data, dict):
        raise ValueError(f"--semaphore-config {path}: needs metadata.name and data")
    limits = {}
    for key, value in data.items():
        if not str(value).strip().isdigit() or int(value) < 1:
            raise ValueError(f"--semaphore-config {path}: data.{key}={value!r} is not a limit >= 1")
        limits[f"{name}/{key}"] = int(value)
    return limits


def wanted(sync: Any) -> list[tuple[str, str]]:
    """The locks a `synchronization` block asks for: ("mutex"|"semaphore", name), in order
    (the deprecated singular `mutex`/`semaphore` forms included)."""
    if not isinstance(sync, dict):
        return []
    locks: list[tuple[str, str]] = []
    mutexes = list(sync.get("mutexes") or []) + ([sync["mutex"]] if sync.get("mutex") else [])
    for m in mutexes:
        locks.append(("mutex", str((m or {}).get("name", ""))))
    sems = list(sync.get("semaphores") or []) + (
        [sync["semaphore"]] if sync.get("semaphore") else []
    )
    for s in sems:
        s = s or {}
        ref = s.get("configMapKeyRef") or {}
        db = s.get("database") or {}
        name = f"{ref.get('name', '')}/{ref.get('key', '')}" if ref else str(db.get("key", ""))
        locks.append(("semaphore", name))
    return locks


def sync_problems(sync: Any, limits: dict[str, int]) -> list[tuple[str, str]]:
    """(field, why) for a `synchronization` block the runner cannot honour."""
    if not isinstance(sync, dict):
        return [("synchronization", "expected a mapping")]
    problems = []
    for key in sync:
        if key not in ("mutexes", "semaphores", "mutex", "semaphore"):
            problems.append((f"synchronization.{key}", "not supported by the local runner"))
    for kind, name in wanted(sync):
        if not name.strip("/") or not _NAME.match(name):
            problems.append((f"synchronization.{kind}", f"needs a name (got {name!r})"))
        elif kind == "semaphore" and "{{" not in name and name not in limits:
            problems.append(
                (
                    f"synchronization.semaphores {name}",
                    f"its limit is in a ConfigMap in Argo; pass --semaphore {name}=N "
                    "(or --semaphore-config CONFIGMAP.yaml)",
                )  # fmt: skip
            )
    return problems


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]+", "_", name)[:200]


def _try_lock(path: Path) -> int | None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _acquire(root: Path, kind: str, name: str, limit: int) -> int | None:
    if kind == "mutex":
        return _try_lock(root / "mutex" / _safe(name))
    for i in range(limit):
        fd = _try_lock(root / "semaphore" / _safe(name) / str(i))
        if fd is not None:
            return fd
    return None


@contextlib.contextmanager
def hold(
    sync: Any,
    *,
    lock_dir: str,
    namespace: str,
    limits: dict[str, int],
    waiting: Callable[[str], None],
    should_stop: Callable[[], bool],
) -> Iterator[bool]:
    """Hold every lock of a (substituted) `synchronization` block for the `with` body.

    Yields True once all are held, False if `should_stop()` became true first (nothing held).
    `waiting(message)` is called once per lock that is not free at the first try."""
    root = Path(lock_dir) / _safe(namespace)
    held: list[int] = []
    try:
        for kind, name in wanted(sync):
            limit = limits.get(name, 1)
            fd = _acquire(root, kind, name, limit)
            if fd is None:
                what = "mutex" if kind == "mutex" else "semaphore"
                waiting(f"Waiting for {namespace}/{what}/{name} lock. Lock status: 0/{limit}")
            while fd is None:
                if should_stop():
                    yield False
                    return
                time.sleep(0.1)
                fd = _acquire(root, kind, name, limit)
            held.append(fd)
        yield True
    finally:
        for fd in held:
            os.close(fd)  # closing the descriptor releases its flock

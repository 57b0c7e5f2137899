"""What a path that is not a checkpoint root is, and where the root is: for the one-line error
of `ckptflow ckpt ls|verify|gc ... ROOT` given the wrong folder or a file.

A run root (`runs/NAME/pretrain`) points at its `ckpt/`; a pipeline run (`runs/NAME`) lists its
checkpoint roots; a step folder names its root; a torch.save file, a safetensors file and a
torch.distributed.checkpoint (DCP) folder say what they are. Reads at most a listing or two and
a file's first bytes (bounded: the path may be anything).
"""

from __future__ import annotations

import posixpath
import struct

from ckptflow.core import layout, runroot
from ckptflow.core.errors import CheckpointError
from ckptflow.core.storage import Storage

__all__ = ["describe", "find_roots"]

MAX_LISTED = 6  # roots named in one message
MAX_LISTINGS = 200  # folders listed looking for them
# roots find_roots returns at most: their JSON list stays under the 256 KiB Argo keeps of a
# container's stdout (`outputs.result`, the retention CronWorkflow's withParam)
FIND_LIMIT = 2_000
FIND_LISTINGS = 50_000  # folders find_roots lists at most
FIND_WIDTH = 10_000  # entries of one folder find_roots looks into (runs under a storage root)
_SEE = "ckptflow ckpt ls"


def describe(st: Storage) -> str | None:
    """One sentence saying what `st` is and which root to give instead; None when it may be a
    checkpoint root (empty, or holding a root's files)."""
    try:
        if st.is_file():
            return _file(st)
        names = set(st.listdir())
    except (OSError, ValueError):
        return None  # the caller's own checks name an unreachable or bad URI
    if not names or layout.ROOT_MARKER in names:
        return None
    return _folder(st, names)


def _file(st: Storage) -> str:
    uri = st.uri
    name = posixpath.basename(uri.rstrip("/"))
    if name == layout.ROOT_MARKER:
        return f"{uri} is the root marker of a checkpoint root: give its folder, {_parent(uri)}"
    head = _head(st)
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":
        what = "a torch.save file (one tensor dict), not a ckptflow checkpoint root"
    elif _safetensors(head):
        what = "a safetensors file (exported weights), not a checkpoint root"
    else:
        what = "a file, not a checkpoint root"
    return f"{uri} is {what}; give the folder of a checkpoint root, e.g. runs/NAME/pretrain/ckpt"


def _folder(st: Storage, names: set[str]) -> str | None:
    uri = st.uri.rstrip("/")
    if ".metadata" in names:
        return (
            f"{uri} is a torch.distributed.checkpoint (DCP) folder (.metadata), not a ckptflow "
            "checkpoint root"
        )
    base = posixpath.basename(uri)
    if any(n.endswith(".safetensors") for n in names):
        return f"{uri} is an exported model (safetensors weights), not a checkpoint root"
    if layout.parse_step_dir(base) is not None:
        return f"{uri} is one step of the checkpoint root {_parent(uri)}: `{_SEE} {_parent(uri)}`"
    if runroot.CKPT in names:
        return f"{uri} is a run root; its checkpoints are in {uri}/{runroot.CKPT}: `{_SEE} {uri}/{runroot.CKPT}`"
    roots = _roots_below(st, names)
    if roots:
        shown = ", ".join(roots[:MAX_LISTED]) + (", ..." if len(roots) > MAX_LISTED else "")
        return f"{uri} holds runs, not checkpoints; its checkpoint roots: {shown}"
    return None


def _roots_below(st: Storage, names: set[str]) -> list[str]:
    """Checkpoint roots up to three levels down (a pipeline run's pretrain/ckpt and
    finetune/V/ckpt, a runs directory's NAME/pretrain/ckpt), found in a bounded walk."""
    out: list[str] = []
    budget = [MAX_LISTINGS]
    _walk(st, "", names, 3, out, budget)
    return [f"{st.uri.rstrip('/')}/{rel}" for rel in out]


def find_roots(st: Storage) -> list[str]:
    """Every checkpoint root the pipelines write under the storage root `st`
    (`NAME/pretrain/ckpt`, `NAME/finetune/VARIANT/ckpt`, a run root's `ckpt`), sorted: what
    the retention CronWorkflow collects. Bounded (FIND_LIMIT roots, FIND_LISTINGS folders
    listed): a storage root may hold anything. Empty when `st` holds nothing."""
    try:
        names = set(st.listdir())
    except (OSError, ValueError):
        return []
    out: list[str] = []
    if runroot.CKPT in names:
        out.append(runroot.CKPT)
    budget = [FIND_LISTINGS]
    _walk(st, "", names, 3, out, budget, limit=FIND_LIMIT, width=FIND_WIDTH)
    if budget[0] <= 0 or len(out) > FIND_LIMIT or len(names) > FIND_WIDTH:
        # a partial list would silently leave roots uncollected
        raise CheckpointError(
            f"{st.uri} holds more than the {FIND_LIMIT} roots or {FIND_LISTINGS} folders "
            "looked through; name the roots explicitly (retention.roots)"
        )
    return sorted(f"{st.uri.rstrip('/')}/{rel}" for rel in out)


def _walk(
    st: Storage,
    rel: str,
    names: set[str],
    depth: int,
    out: list[str],
    budget,
    *,
    limit: int = MAX_LISTED,
    width: int = 64,
) -> None:
    for name in sorted(names)[:width]:  # bounded: the folder may hold anything
        if name.startswith(".") or budget[0] <= 0 or len(out) > limit:
            return
        child = f"{rel}/{name}" if rel else name
        if st.is_file(child):
            continue
        budget[0] -= 1
        below = set(st.listdir(child))
        if runroot.CKPT in below:
            out.append(f"{child}/{runroot.CKPT}")
        elif depth > 1 and layout.ROOT_MARKER not in below:
            _walk(st, child, below, depth - 1, out, budget, limit=limit, width=width)


def _parent(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[0]


def _head(st: Storage) -> bytes:
    try:
        with st.open("", "rb") as fh:
            return fh.read(16)
    except (OSError, ValueError):
        return b""


def _safetensors(head: bytes) -> bool:
    if len(head) < 10:
        return False
    (n,) = struct.unpack("<Q", head[:8])
    return 0 < n < (100 << 20) and head[8:10] == b'{"'

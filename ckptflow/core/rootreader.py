"""Reading a checkpoint root: the root marker, the steps, their commit state and manifests.

Everything here only reads (except `ensure_root`, which claims an empty root). A step is
committed when its COMMIT marker exists; it is valid when the marker names a manifest whose
checksum matches and whose root id is this root's.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import uuid

from ckptflow.core import codec, jsonfile, layout
from ckptflow.core import manifest as mf
from ckptflow.core.errors import CheckpointError, CorruptCheckpoint
from ckptflow.core.storage import AlreadyExists, Storage

_KNOWN_TOP = {layout.ROOT_MARKER, layout.OBJECTS}


def read_root_id(storage: Storage) -> str | None:
    """The root id, or None for a root that holds nothing yet; raise for a foreign root."""
    try:
        doc = jsonfile.read(storage, layout.ROOT_MARKER)
    except FileNotFoundError:
        foreign = [
            n for n in storage.listdir() if n not in _KNOWN_TOP and layout.parse_step_dir(n) is None
        ]
        if foreign:
            raise CheckpointError(
                f"{storage.uri} holds something else ({', '.join(foreign[:5])}); "
                "use an empty or ckptflow-owned root for checkpoints"
            ) from None
        return None
    except jsonfile.BadJsonFile as exc:
        raise CheckpointError(
            f"{storage.url(layout.ROOT_MARKER)} is not a ckptflow root marker ({exc.reason})"
        ) from None
    if (
        not isinstance(doc, dict)
        or doc.get("format") != layout.ROOT_FORMAT
        or not isinstance(doc.get("root_id"), str)
    ):
        raise CheckpointError(f"{storage.url(layout.ROOT_MARKER)} is not a ckptflow root marker")
    return doc["root_id"]


def ensure_root(storage: Storage, parent: dict | None = None) -> str:
    """Return the root id, creating the root marker (exclusively) for a new root.

    `parent` ({"uri", "step", "root_id"}) names a committed step of another root whose objects
    this root's manifests may reference (a fine-tune deduplicated against its base).
    """
    storage.check_reachable()
    root_id = read_root_id(storage)
    if root_id is not None:
        return root_id
    doc = {
        "format": layout.ROOT_FORMAT,
        "version": layout.FORMAT_VERSION,
        "root_id": uuid.uuid4().hex,
        "created_at": time.time(),
    }
    if parent:
        doc["parent"] = parent
    # Another writer may have created it first: then theirs is used.
    with contextlib.suppress(AlreadyExists):
        storage.write(layout.ROOT_MARKER, json.dumps(doc).encode(), exclusive=True)
    return read_root_id(storage)


def step_names(storage: Storage) -> dict[int, str]:
    """All step folders under the root (committed or not): step -> folder name."""
    out = {}
    for name in storage.listdir():
        step = layout.parse_step_dir(name)
        if step is not None:
            out[step] = name
    return out


def committed_steps(storage: Storage) -> list[int]:
    """Steps whose commit marker exists, ascending."""
    return sorted(s for s in step_names(storage) if storage.exists(layout.commit_path(s)))


MAX_TIME = 1e11  # epoch seconds (year 5138): a later commit time is corrupt or hostile


def commit_time(v, where: str) -> float:
    """A commit or creation time read from a file: a finite number in [0, MAX_TIME] (a string,
    boolean, list, infinity or huge number would crash the listing or the retention rules)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= MAX_TIME:
        raise ValueError(f"{where}: expected a time in epoch seconds, got {str(v)[:40]!r}")
    t = float(v)
    if math.isnan(t):
        raise ValueError(f"{where}: expected a time in epoch seconds, got NaN")
    return t


def parse_commit(blob: bytes, url: str) -> dict:
    """A commit marker's fields, each checked (CorruptCheckpoint naming the file otherwise):
    `save_id` (names the manifest), `manifest_xxh3` and the optional `committed_at` (a marker
    moved from another step is found by the manifest's own step number)."""
    doc = jsonfile.loads(blob, what=url)
    try:
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        if not (isinstance(doc.get("save_id"), str) and layout.SAVE_ID_RE.match(doc["save_id"])):
            raise ValueError("save_id")
        if not isinstance(doc.get("manifest_xxh3"), str) or len(doc["manifest_xxh3"]) > 64:
            raise ValueError("manifest_xxh3")
        if doc.get("committed_at") is not None:
            doc["committed_at"] = commit_time(doc["committed_at"], "committed_at")
    except ValueError as exc:
        raise CorruptCheckpoint(f"{url}: commit marker is malformed ({exc})", [url]) from None
    return doc


def read_commit(storage: Storage, step: int) -> dict:
    """The commit marker of a step (raises FileNotFoundError when it is not committed)."""
    rel = layout.commit_path(step)
    return parse_commit(storage.read(rel, limit=jsonfile.MAX_BYTES + 1), storage.url(rel))


def read_manifest(storage: Storage, step: int, root_id: str | None = None) -> dict:
    """The validated manifest of a committed step (CorruptCheckpoint names the bad file)."""
    try:
        commit = read_commit(storage, step)
    except FileNotFoundError:
        raise CheckpointError(
            f"step {step} has no committed checkpoint under {storage.uri}; "
            f"committed steps: {committed_steps(storage) or 'none'}"
        ) from None
    rel = f"{layout.step_dir(step)}/{layout.manifest_name(commit['save_id'])}"
    url = storage.url(rel)
    try:
        blob = storage.read(rel)  # (a 512 MiB limit would allocate 512 MiB up front)
    except FileNotFoundError:
        raise CorruptCheckpoint(
            f"{url}: manifest named by the commit marker is missing", [url]
        ) from None
    if codec.digest(blob) != commit["manifest_xxh3"]:
        raise CorruptCheckpoint(f"{url}: manifest checksum does not match the commit marker", [url])
    try:
        m = mf.parse(blob)
    except mf.ManifestError as exc:
        raise CorruptCheckpoint(f"{url}: {exc}", [url]) from exc
    if m["step"] != step:
        raise CorruptCheckpoint(f"{url}: manifest is for step {m['step']}, not {step}", [url])
    root_id = root_id or read_root_id(storage)
    if m["root_id"] != root_id:
        raise CorruptCheckpoint(
            f"{url}: manifest belongs to another checkpoint root (a foreign run)", [url]
        )
    return m


def read_parent(storage: Storage) -> dict | None:
    """The root marker's `parent` ({"uri", "step", "root_id"}), or None (the usual case)."""
    try:
        doc = jsonfile.read(storage, layout.ROOT_MARKER)
    except (FileNotFoundError, jsonfile.BadJsonFile):
        return None
    parent = doc.get("parent") if isinstance(doc, dict) else None
    if not (isinstance(parent, dict) and isinstance(parent.get("uri"), str)):
        return None
    return parent


def parent_stores(storage: Storage, depth: int = 8) -> list[Storage]:
    """Where objects this root borrows live: its parent step's storage (its archive root when
    that step was archived), then the parent's own parents. [] for an ordinary root."""
    out: list[Storage] = []
    parent, st = read_parent(storage), storage
    while parent is not None and len(out) < depth:
        st = st.peer(parent["uri"])
        step = parent.get("step")
        out.append(locate(st, step) if isinstance(step, int) else st)
        parent = read_parent(st)
    return out


def read_object(storage: Storage, key: str, fallbacks: list[Storage]) -> tuple[bytes, str]:
    """An object's stored bytes and URL: from `storage`, else from the first fallback (a parent
    root) holding it. FileNotFoundError (naming `storage`'s URL) when none has it."""
    rel = layout.object_path(key)
    for st in (storage, *fallbacks):
        try:
            return st.read(rel), st.url(rel)
        except FileNotFoundError:
            continue
    raise FileNotFoundError(storage.url(rel))


def verify_objects(storage: Storage, m: dict, keys: list[str] | None = None) -> list[str]:
    """Read every object a manifest needs, check size and checksum; return the bad files."""
    bad = []
    fallbacks = parent_stores(storage)
    for key in sorted(keys if keys is not None else m["objects"]):
        rel = layout.object_path(key)
        try:
            blob, _ = read_object(storage, key, fallbacks)
        except FileNotFoundError:
            bad.append(f"{storage.url(rel)} (missing)")
            continue
        if len(blob) != m["objects"][key]["size"]:
            bad.append(
                f"{storage.url(rel)} (size {len(blob)}, expected {m['objects'][key]['size']})"
            )
        elif codec.digest(blob) != key:
            bad.append(f"{storage.url(rel)} (checksum mismatch)")
    return bad


def locate(storage: Storage, step: int) -> Storage:
    """The storage that holds a step's data: its archive root when the step folder has an
    ARCHIVED marker (written only after the archive copy was verified), else `storage` itself."""
    rel = f"{layout.step_dir(step)}/{layout.ARCHIVED}"
    try:
        doc = jsonfile.read(storage, rel)
    except FileNotFoundError:
        return storage
    uri = doc.get("uri") if isinstance(doc, dict) else None
    if not isinstance(uri, str) or not uri or len(uri) > 4096:
        url = storage.url(rel)
        raise CorruptCheckpoint(f"{url}: archive marker is malformed", [url])
    return storage.peer(uri)

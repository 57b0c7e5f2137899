"""Where a step's data lives: its archive root, when an ARCHIVED marker redirects the step
(proved before it is followed), and the parent roots whose objects a fine-tune's manifests
borrow; reading and verifying objects across them.

Split from ckptflow.core.rootreader, whose markers, commits and manifests these read.
"""

from __future__ import annotations

from ckptflow.core import codec, jsonfile, layout, localio
from ckptflow.core.errors import CheckpointError, CorruptCheckpoint
from ckptflow.core.rootreader import MAX_MARKER, read_commit, read_parent, read_root_id
from ckptflow.core.storage import Storage, StorageError
from ckptflow.core.storage_errors import translated
from ckptflow.core.uris import supported


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
        except StorageError as exc:
            # a folder where the object's file goes (or a file where its folder goes) is that
            # object missing, not a wrong root: the step is damaged and a load falls back
            if exc.kind != "not-a-folder":
                raise
    raise FileNotFoundError(storage.url(rel))


def read_object_into(
    storage: Storage, key: str, fallbacks: list[Storage], size: int, get_buf
) -> tuple:
    """An object read into `get_buf(size)` (locally with no intermediate copy), from `storage`
    else the first fallback holding it: (buffer, the file's size, URL). The buffer is None,
    and nothing allocated, when the file's size is not `size`. FileNotFoundError when absent."""
    rel = layout.object_path(key)
    for st in (storage, *fallbacks):
        try:
            n, buf = _read_into(st, rel, size, get_buf)
        except FileNotFoundError:
            continue
        except StorageError as exc:
            if exc.kind != "not-a-folder":  # as in read_object: the object is missing
                raise
            continue
        return buf, n, st.url(rel)
    raise FileNotFoundError(storage.url(rel))


def _read_into(st: Storage, rel: str, expect: int, get_buf) -> tuple:
    if st.protocol != "file":  # through Storage.read: its retries and error translation
        data = st.read(rel, limit=expect + 1)
        if len(data) != expect:
            return len(data), None
        buf = get_buf(expect)
        buf[:] = memoryview(data).cast("B")
        return expect, buf
    with translated(st.url(rel)), st.fs.open(st.path(rel), "rb") as f:
        n, buf = localio.read_into(f, expect, get_buf)
    st.meter.add(n if buf is not None else 0)  # (a size mismatch read nothing)
    return n, buf


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
    ARCHIVED marker (written only after the archive copy was verified), else `storage` itself.

    A redirect is proved before it is followed: it must use a supported URI scheme and name a
    root whose marker has this root's id and whose copy of the step is committed as the same
    save (save id and manifest checksum) as here. A torn, dangling or foreign redirect makes
    the step corrupt (CorruptCheckpoint naming the marker: loads fall back), never a way to
    read another run's data, and never a failure of the whole root."""
    rel = f"{layout.step_dir(step)}/{layout.ARCHIVED}"
    try:
        blob = storage.read(rel, limit=MAX_MARKER + 1)
    except FileNotFoundError:
        return storage
    url = storage.url(rel)
    uri = _redirect_uri(blob)
    if uri is None:
        raise CorruptCheckpoint(f"{url}: archive marker is malformed (torn or not JSON)", [url])
    if not supported(uri):
        raise CorruptCheckpoint(
            f"{url}: archive marker names {uri[:100]!r}, not a supported storage URI", [url]
        )
    archive = storage.peer(uri)
    why = _not_the_copy(storage, archive, step)
    if why:
        raise CorruptCheckpoint(
            f"{url}: ARCHIVED names {archive.uri}, which {why}; the step is not read there", [url]
        )
    return archive


def _redirect_uri(blob: bytes) -> str | None:
    """The `uri` of an ARCHIVED marker's bytes, or None when they are not a marker."""
    try:
        doc = jsonfile.loads(blob, what="ARCHIVED", max_bytes=MAX_MARKER)
    except jsonfile.BadJsonFile:
        return None
    uri = doc.get("uri") if isinstance(doc, dict) else None
    return uri if isinstance(uri, str) and uri and len(uri) <= 4096 else None


def _not_the_copy(storage: Storage, archive: Storage, step: int) -> str | None:
    """Why `archive` is not this root's copy of `step` (None when it is)."""
    try:
        here = read_commit(storage, step)
    except FileNotFoundError:
        return "cannot be checked: the step has no commit marker here"
    try:
        there = read_commit(archive, step)
        # The archive's root marker is not a single point of failure either: lost or damaged,
        # its id is the one its committed steps agree on (as for the hot root). Refusing the
        # redirect instead made an intact archived step look corrupt, and gc deleted its hot
        # folder, the only way to it.
        archive_id = read_root_id(archive)
    except FileNotFoundError:
        return "holds no committed copy of this step"
    except (CheckpointError, StorageError, OSError) as exc:
        return f"cannot be read as an archive root ({type(exc).__name__}: {str(exc)[:200]})"
    if archive_id is None:
        return "has no root marker"
    if archive_id != read_root_id(storage):
        return f"belongs to another run (root id {archive_id[:64]})"
    if (there.get("save_id"), there.get("manifest_xxh3")) != (
        here["save_id"],
        here["manifest_xxh3"],
    ):
        return f"holds a different save of step {step}"
    return None

"""The listing of a checkpoint root: one row per step folder, as `ckptflow ckpt ls` shows it.

A row says what a step is (full, delta, or deduplicated: a full step that stored little that
was new), its logical and stored size, its state (committed, uncommitted leftover of a save, or
corrupt when a check found it), whether it is pinned, its tier (hot, or archive when its data
was moved), and the evaluation metrics an evaluator recorded. The cheap checks read the commit
marker and manifest and list the objects (existence and size); `deep=True` also reads every
byte. Rows become `retention.CatalogEntry` values for the policies.
"""

from __future__ import annotations

import contextlib
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from ckptflow.core import codec, layout, locator, rootguess, rootreader, runroot
from ckptflow.core.errors import CheckpointError, CorruptCheckpoint
from ckptflow.core.retention import CatalogEntry
from ckptflow.core.storage import Entry, Storage, StorageError

DEDUP_RATIO = 0.5  # a full step whose new bytes are below this share of its stored bytes
LIST_THREADS = 16  # object folders listed at once (present_objects: the commit check, `ls`)


@dataclass
class StepRow:
    """One step folder of a root, with what the catalog knows about it."""

    step: int  # training step
    state: str  # "committed", "corrupt" or "uncommitted"
    kind: str | None = None  # "full", "delta" or "deduplicated" (None: no readable manifest)
    base_step: int | None = None  # the full step a delta needs
    logical_bytes: int = 0  # raw bytes of the state dict (manifest stats.raw_bytes)
    stored_bytes: int = 0  # bytes of every object the step references
    new_bytes: int = 0  # bytes this save wrote (the rest was shared)
    # how the save compressed (manifest.COMPRESSION_MODES; None: a manifest from before the
    # mode was recorded) and the logical bytes it stored compressed
    compression: str | None = None
    compressed_bytes: int = 0
    pinned: bool = False  # a PIN file exists: never deleted by a policy
    pin_reason: str | None = None  # why it was pinned
    tier: str = "hot"  # "hot", or "archive" when an ARCHIVED marker names its archive root
    archive_uri: str | None = None  # the archive root (tier "archive")
    metrics: dict[str, float] = field(default_factory=dict)  # from its eval record
    committed_at: float | None = None  # commit time (epoch seconds)
    save_id: str | None = None  # the save the commit marker names
    manifest_id: str | None = None  # whose manifest readers use: save_id, or the slim's
    slimmed_at: float | None = None  # weights only since then (ckptflow.core.slim)
    age_s: float | None = None  # since commit; uncommitted: since its newest file changed
    problems: list[str] = field(default_factory=list)  # bad files, for corrupt steps
    objects: dict[str, int] = field(default_factory=dict, repr=False)  # key -> stored size
    files: list[Entry] = field(default_factory=list, repr=False)  # its folder, when listed

    @property
    def ratio(self) -> float | None:
        """Logical / stored bytes (how much compression, deltas and sharing saved)."""
        return self.logical_bytes / self.stored_bytes if self.stored_bytes else None

    @property
    def compressed_share(self) -> float | None:
        """The share of the logical bytes stored compressed (None: not recorded)."""
        if self.compression is None:
            return None
        return self.compressed_bytes / self.logical_bytes if self.logical_bytes else 0.0

    @property
    def valid(self) -> bool:
        return self.state == "committed"

    def entry(self) -> CatalogEntry:
        """This row as the retention policies see it (committed rows only)."""
        return CatalogEntry(
            step=self.step,
            committed_at=self.committed_at or 0.0,
            kind="delta" if self.kind == "delta" else "full",
            base_step=self.base_step,
            pinned=self.pinned,
            metrics=dict(self.metrics),
            tier=self.tier,
            valid=self.valid,
        )

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("objects")
        d.pop("files")
        d["ratio"] = self.ratio
        d["compressed_share"] = self.compressed_share
        return d


def open_root(uri: str, storage: Storage | None = None, *, must_exist: bool = True) -> Storage:
    """A Storage for a checkpoint root, with the errors a user can cause made clear: a bad
    URI, a missing bucket, a folder that holds something else, or (must_exist) nothing there."""
    st = storage or Storage(uri)
    st.check_reachable()
    hint = rootguess.describe(st)  # a file, a run root, a DCP folder...: say where the root is
    if hint:
        raise CheckpointError(hint)
    if st.is_file():
        raise CheckpointError(f"{st.uri} is a file, not a checkpoint root; check the root URI")
    if rootreader.read_root_id(st) is None and must_exist and not st.listdir():
        raise CheckpointError(f"{st.uri}: no checkpoints there; check the root URI")
    return st


def _metrics(storage: Storage, step: int) -> dict[str, float]:
    """A step's evaluation metrics for its row (NaN left out). A damaged eval.json shows none:
    the checkpoint itself is sound, and the record's reader names the file to whoever uses it."""
    try:
        rec = runroot.read_eval(storage, step)
    except runroot.RecordError:
        return {}
    return {k: v for k, v in (rec.metrics if rec else {}).items() if not math.isnan(v)}


def step_files(storage: Storage, step: int) -> list[Entry]:
    """Every file of a step folder, with size and modification time."""
    return storage.walk(layout.step_dir(step))


def read_row(
    storage: Storage, step: int, root_id: str | None, now: float, files: list | None = None
) -> StepRow:
    """A step's row from its folder alone (no object checks; see `check_objects`); `files`:
    the folder's files when the caller listed them already (rootreader.step_folders)."""
    files = step_files(storage, step) if files is None else files
    names = {e.path.rsplit("/", 1)[-1] for e in files}
    row = StepRow(step=step, state="uncommitted", files=files)
    if files:
        row.age_s = max(0.0, now - max(e.mtime for e in files))
    if runroot.PIN in names:
        row.pinned, row.pin_reason = True, runroot.pin_reason(storage, step)
    if runroot.EVAL in names:
        row.metrics = _metrics(storage, step)
    if layout.COMMIT not in names:
        return row
    try:
        commit = rootreader.read_commit(storage, step)
        row.save_id, row.committed_at = commit["save_id"], float(commit.get("committed_at") or 0)
        m = rootreader.read_manifest(storage, step, root_id)
    except FileNotFoundError:  # the commit marker went away while we looked (GC)
        return row
    except CorruptCheckpoint as exc:
        row.state, row.problems = "corrupt", list(exc.files) or [str(exc)]
        return row
    stats = m["stats"]
    row.state = "committed"
    row.kind, row.base_step = m["kind"], m.get("base_step")
    if row.kind == "full" and stats["new_bytes"] < DEDUP_RATIO * stats["stored_bytes"]:
        row.kind = "deduplicated"
    row.logical_bytes, row.stored_bytes = stats["raw_bytes"], stats["stored_bytes"]
    row.new_bytes = stats["new_bytes"]
    comp = stats.get("compression")
    if comp is not None:  # (validated with the manifest)
        row.compression, row.compressed_bytes = comp["mode"], comp["compressed_bytes"]
    row.objects = {k: v["size"] for k, v in m["objects"].items()}
    slimmed = m.get("slimmed")
    row.manifest_id = slimmed["slim_id"] if slimmed else row.save_id
    row.slimmed_at = float(slimmed["at"]) if slimmed else None
    row.committed_at = row.committed_at or float(m["created_at"])
    row.age_s = max(0.0, now - row.committed_at)
    if layout.ARCHIVED in names:
        # after the hot manifest was read: a step whose redirect is bad is corrupt, and its
        # row still names the objects it needs (GC keeps them while the step is kept)
        try:
            located = locator.locate(storage, step)
        except CorruptCheckpoint as exc:
            row.state, row.problems = "corrupt", list(exc.files) or [str(exc)]
            return row
        if located is not storage:
            row.tier, row.archive_uri = "archive", located.uri
    return row


def list_objects(storage: Storage) -> dict[str, Entry]:
    """Every object under the root: key -> Entry (size, mtime). One listing, no reads."""
    _uncached(storage)
    return dict(_placed(storage.walk(layout.OBJECTS)))


def _uncached(storage: Storage) -> None:
    """Drop the backend's cached listings: a long-lived process must not see a stale one."""
    with contextlib.suppress(AttributeError):
        storage.fs.invalidate_cache()


def _placed(entries):
    """(key, entry) of the files at their key's own path, where readers look for them. A file
    named like a key in another key's folder (an alias) is not that object: taken for it, an
    old alias made GC delete a young object, and an archive skip copying one (then fail)."""
    for e in entries:
        key = e.path.rsplit("/", 1)[-1]
        if layout.KEY_RE.match(key) and e.path == layout.object_path(key):
            yield key, e


def check_objects(
    row: StepRow, listing: dict[str, Entry], located: Storage, borrowed: dict[str, int | None]
) -> None:
    """Mark a committed row corrupt when an object it needs is missing or has the wrong size.
    An object not in this root may be borrowed from a parent root (a fine-tune's base):
    `borrowed` caches its size there (None: absent everywhere)."""
    borrowed.update(
        borrowed_sizes(located, [k for k in row.objects if k not in listing and k not in borrowed])
    )
    have = {k: listing[k].size if k in listing else borrowed[k] for k in row.objects}
    row.problems.extend(size_problems(located, row.objects, have))
    if row.problems:
        row.state = "corrupt"


def missing_objects(storage: Storage, sizes: dict[str, int]) -> list[str]:
    """The objects of `sizes` (key -> stored size) that are absent or of another size, in the
    root or, for objects it borrows, in its parent roots (the first holding one gives its
    size). What a save checks before it commits."""
    have = {k: e.size for k, e in present_objects(storage, sizes).items()}
    have |= borrowed_sizes(storage, [k for k in sizes if k not in have])
    return size_problems(storage, sizes, have)


def size_problems(
    storage: Storage, sizes: dict[str, int], have: dict[str, int | None]
) -> list[str]:
    """One entry per object of `sizes` (key -> expected stored size) whose found size in
    `have` (None: absent) is missing or another, naming its URL in `storage`, in key order:
    the one wording of a damaged step, whether its objects were listed or looked at one by
    one."""
    bad = []
    for key, size in sorted(sizes.items()):
        url = storage.url(layout.object_path(key))
        if have[key] is None:
            bad.append(f"{url} (missing)")
        elif have[key] != size:
            bad.append(f"{url} (size {have[key]}, expected {size})")
    return bad


def borrowed_sizes(storage: Storage, keys: list[str]) -> dict[str, int | None]:
    """The sizes of `keys` in the root's parent roots, the first holding one giving it (None:
    in none), found by listing their prefix folders (a HEAD per object was one request after
    another for each of a fine-tune's borrowed objects). Parents are read only when asked."""
    out: dict[str, int | None] = dict.fromkeys(keys)
    todo = list(keys)
    for parent in locator.parent_stores(storage) if todo else []:
        found = present_objects(parent, todo)
        out.update((k, e.size) for k, e in found.items())
        todo = [k for k in todo if k not in found]
        if not todo:
            break
    return out


def present_objects(storage: Storage, keys) -> dict[str, Entry]:
    """The objects among `keys` found where readers look for them: key -> Entry.

    Lists only the key-prefix folders of `keys`, LIST_THREADS at a time: a root keeping many
    checkpoints holds millions of objects, and an object store pages a listing 1,000 keys per
    request, one page after another (the whole objects folder, before every commit, was
    O(root) requests per save)."""
    _uncached(storage)
    wanted = set(keys)
    folders = sorted({layout.object_path(k).rsplit("/", 1)[0] for k in wanted})
    out: dict[str, Entry] = {}
    if not folders:
        return out
    with ThreadPoolExecutor(min(LIST_THREADS, len(folders)), "ckpt-list") as pool:
        for entries in pool.map(storage.walk, folders):
            out.update((k, e) for k, e in _placed(entries) if k in wanted)
    return out


def verify_step(
    storage: Storage, step: int, *, threads: int = 8, progress=None
) -> tuple[dict | None, list[str]]:
    """Read every byte of a committed step (from its archive root when archived, borrowed
    objects from parent roots) and check sizes and checksums. Returns (manifest, bad files);
    `progress(nbytes, total_bytes)` is called as each object is checked."""
    try:  # a bad ARCHIVED redirect is damage of this step: reported, the others go on
        located = locator.locate(storage, step)
        m = rootreader.read_manifest(located, step)
    except CorruptCheckpoint as exc:
        return None, list(exc.files) or [str(exc)]
    fallbacks = locator.parent_stores(located)
    total = sum(v["size"] for v in m["objects"].values())

    def one(key: str) -> str | None:
        size = m["objects"][key]["size"]
        try:
            blob, url = locator.read_object(located, key, fallbacks)
        except FileNotFoundError:
            return f"{located.url(layout.object_path(key))} (missing)"
        finally:
            if progress is not None:
                progress(size, total)
        if len(blob) != size:
            return f"{url} (size {len(blob)}, expected {size})"
        return f"{url} (checksum mismatch)" if codec.digest(blob) != key else None

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ckpt-verify") as pool:
        bad = [b for b in pool.map(one, sorted(m["objects"])) if b]
    return m, bad


def build_rows(
    storage: Storage, *, now: float, check: bool = True, deep: bool = False
) -> list[StepRow]:
    """One row per step folder, ascending. `check` lists objects; `deep` reads every byte."""
    root_id = rootreader.read_root_id(storage)
    # one listing of every step folder's files: junk folders cost no request each (issue 37)
    folders = rootreader.step_folders(storage)
    steps = set(rootreader.step_names(storage)) | set(folders)  # (empty local folders too)
    rows = [read_row(storage, s, root_id, now, folders.get(s, [])) for s in sorted(steps)]
    if not (check or deep):
        return rows
    # Objects are listed AFTER the manifests were read: a step committed by then has them all.
    listings: dict[str, dict[str, Entry]] = {}
    borrowed: dict[str, dict[str, int | None]] = {}  # per located root: key -> size
    for row in rows:
        if row.state != "committed":
            continue
        if deep:
            _, bad = verify_step(storage, row.step)
            if bad:
                row.state, row.problems = "corrupt", bad
            continue
        located = storage.peer(row.archive_uri) if row.archive_uri else storage
        if located.uri not in listings:
            try:
                listings[located.uri] = list_objects(located)
            except StorageError as exc:  # an archive root gone or unreachable: say so per row
                listings[located.uri] = {}
                row.problems.append(f"{located.uri}: cannot list objects ({exc})")
        check_objects(row, listings[located.uri], located, borrowed.setdefault(located.uri, {}))
    return rows


def entries(rows: list[StepRow]) -> list[CatalogEntry]:
    """The committed (valid or corrupt) rows as retention catalog entries."""
    return [r.entry() for r in rows if r.state != "uncommitted"]


def human_bytes(n: float) -> str:
    """A byte count for people: 0 B, 512 B, 1.5 KiB, 3.2 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def human_age(seconds: float | None) -> str:
    """An age for people: 45s, 12m, 3.5h, 2.0d."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"

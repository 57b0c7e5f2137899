"""Which objects a checkpoint root's steps still reference, and the deletion of the others:
the object side of garbage collection (ckptflow.core.gc; ckptflow.core.archive frees what it
moved with it too).

An object goes only when no kept manifest names it, it is older than the cutoff, and no live
save started before it was written (see `free_objects`). Split from ckptflow.core.gc.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor

from ckptflow.core import intent, jsonfile, layout, listing, locator, rootreader
from ckptflow.core import manifest as mf
from ckptflow.core.errors import CorruptCheckpoint
from ckptflow.core.storage import Storage


def delete_files(st: Storage, rels: list[str], threads: int = 16) -> None:
    if not rels:
        return
    with ThreadPoolExecutor(max_workers=min(threads, len(rels))) as pool:
        list(pool.map(lambda r: st.delete([r]), rels))


def referenced(
    st: Storage,
    rows: list[listing.StepRow],
    skip: set[int],
    fresh: bool,
    warnings: list[str],
    slim_cutoff: float | None = None,
) -> set[str] | None:
    """Object keys hot steps need: committed steps (listed again when `fresh`; else the rows
    less `skip`) and manifests of saves not committed yet. None when a needed manifest is
    unreadable, so no object is deleted on a guess."""
    if fresh:
        cache = {(r.step, r.save_id): r for r in rows if r.save_id and r.objects}
        root_id = rootreader.read_root_id(st)
        committed = [_current(st, s, cache, root_id) for s in rootreader.committed_steps(st)]
    else:
        committed = [r for r in rows if r.state != "uncommitted" and r.step not in skip]
    refs: set[str] = set()
    for row in committed:
        if row.state == "uncommitted" or row.tier != "hot":
            continue  # deleted meanwhile, or its data lives in the archive root
        if row.state == "corrupt" and not row.objects:  # the manifest itself is unreadable
            warnings.append(
                f"objects not collected: the manifest of kept step {row.step} cannot be read "
                f"({'; '.join(row.problems)}); repair it or delete that step"
            )
            return None
        refs |= set(row.objects)
        if row.slimmed_at is not None and (slim_cutoff is None or row.slimmed_at > slim_cutoff):
            # slimmed within the grace: a reader may still be loading the full step
            refs |= _manifest_refs(st, f"{layout.step_dir(row.step)}/manifest-{row.save_id}.json")
    if fresh:  # one listing of the step folders, not a request per folder (issue 37)
        folders = rootreader.step_folders(st)
        pending = {s: f for s, f in folders.items() if not rootreader.has_commit(s, f)}
    else:
        pending = {r.step: r.files for r in rows if r.state == "uncommitted"}
    for step, files in pending.items():
        refs |= _pending_refs(st, step, [e.path.rsplit("/", 1)[-1] for e in files])
    return refs


def _current(st: Storage, step: int, cache: dict, root_id: str | None) -> listing.StepRow:
    """A committed step's row now: the cached one when the same save is still committed."""
    try:
        save_id = rootreader.read_commit(st, step)["save_id"]
    except (FileNotFoundError, CorruptCheckpoint):
        save_id = None
    row = cache.get((step, save_id))
    if row is None:
        return listing.read_row(st, step, root_id, time.time())
    try:  # an archive run may have moved it meanwhile
        row.tier = "archive" if locator.locate(st, step) is not st else "hot"
    except CorruptCheckpoint:
        row.tier = "hot"
    return row


def _live_saves(st: Storage, now: float) -> list[float]:
    """When each live save under the root started (looked at after the object listing, so a
    save that started before it is seen); see ckptflow.core.intent."""
    starts: list[float] = []
    for step, files in rootreader.step_folders(st).items():  # one listing (issue 37)
        if not rootreader.has_commit(step, files):
            starts += intent.live_starts(st, step, now, files)
    return starts


def _pending_refs(st: Storage, step: int, names: list[str]) -> set[str]:
    """Objects named by a manifest in an uncommitted folder (a save about to commit); `names`:
    the folder's file names."""
    refs: set[str] = set()
    sd = layout.step_dir(step)
    for name in names:
        if name.startswith("manifest-") and name.endswith(".json"):
            # A damaged one protects nothing: a save still writing has objects younger than
            # the grace, and a leftover's objects are garbage.
            refs |= _manifest_refs(st, f"{sd}/{name}")
    return refs


def _manifest_refs(st: Storage, rel: str) -> set[str]:
    """Object keys a manifest file names (empty when it is gone or damaged)."""
    with contextlib.suppress(FileNotFoundError, jsonfile.BadJsonFile):
        doc = jsonfile.loads(  # (read whole: a 512 MiB limit allocates 512 MiB)
            st.read(rel), what=st.url(rel), max_bytes=mf.MAX_MANIFEST, max_depth=mf.MAX_DEPTH
        )
        objects = doc.get("objects") if isinstance(doc, dict) else None
        if isinstance(objects, dict):
            return {k for k in objects if layout.KEY_RE.match(k)}
    return set()


def free_objects(
    st: Storage,
    rows: list,
    skip: set[int],
    cutoff: float,
    warnings: list[str],
    apply: bool,
    only: set[str] | None = None,
    now: float | None = None,
    young: list[int] | None = None,
) -> tuple[list[str], int]:
    """Objects (among `only`, if given) older than the cutoff that no kept manifest references;
    deleted when `apply`. Returns the keys and their bytes. Objects written since a live save
    started are kept whatever the cutoff: that save names them only when it writes its
    manifest. `young` gets the size of each unreferenced object the cutoff keeps."""
    present = listing.list_objects(st)
    # Listed again right before deleting: a save that committed meanwhile keeps its objects.
    refs = referenced(st, rows, skip, fresh=apply, warnings=warnings, slim_cutoff=cutoff)
    if refs is None:
        return [], 0
    cutoff = min([cutoff, *_live_saves(st, time.time() if now is None else now)])
    keys = sorted(
        k
        for k, e in present.items()
        if k not in refs and e.mtime < cutoff and (only is None or k in only)
    )
    if young is not None:
        young += [
            e.size
            for k, e in present.items()
            if k not in refs and e.mtime >= cutoff and (only is None or k in only)
        ]
    if apply:
        delete_files(st, [layout.object_path(k) for k in keys])
    return keys, sum(present[k].size for k in keys)

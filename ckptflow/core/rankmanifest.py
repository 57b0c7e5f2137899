"""Per-rank manifests (format 5, issue 36): a step index naming one manifest per rank, their
validation, and their merge into one manifest of the usual shape (torch-free).

A save with per-rank manifests has every rank write the manifest of its own chunks
(`manifest-<id>-r<rank>.json`, the shape of a format-4 manifest plus `rank`); rank 0 gathers
only (name, checksum, counts) of each and writes the step index (`manifest-<id>.json`, named
by COMMIT as a single manifest is): no rank does work per chunk of another rank. Readers:

- `rankview.read_rank_view`: what one rank of the same world size loads from: the index and
  its own manifest (every item it holds, replicated ones included). O(its own shards + the
  index).
- `read_merged` (through rootreader.read_manifest): every rank manifest, each checked against
  its checksum in the index and against the index's save, merged into one manifest dict that
  every other reader (GC, verify, ls, slim, archive, resharding loads) uses unchanged.

Every file may be damaged or crafted: sizes, counts and fields are bounded and checked, and
errors (CorruptCheckpoint, FileMissing) name the file.
"""

from __future__ import annotations

import time

from ckptflow.core import codec, layout
from ckptflow.core import manifest as mf
from ckptflow.core.errors import CorruptCheckpoint, FileMissing
from ckptflow.core.storage import Storage

MAX_INDEX = 64 << 20  # bytes of a step index: ~150 per rank (1,024 ranks: ~150 KiB)
MAX_RANKS = 1 << 20  # ranks one index may name
_RECORD_KEYS = {"rank", "manifest", "xxh3", "bytes", "items", "objects"}
_COPIED = ("step", "save_id", "root_id", "world_size", "kind", "base_step", "created_at")


def is_index(doc) -> bool:
    """Whether parsed manifest JSON is a step index (format 5), not a manifest."""
    return isinstance(doc, dict) and doc.get("index") is True


# -- what a rank sends rank 0, and the index rank 0 writes ---------------------------------------
def rank_record(rank: int, name: str, blob: bytes, m: dict | None = None) -> dict:
    """What a rank gathers to rank 0 about its rank manifest (`m`: its parsed content, for the
    counts; a few dozen bytes)."""
    return {
        "rank": rank,
        "manifest": name,
        "xxh3": codec.digest(blob),
        "bytes": len(blob),
        "items": len(m["items"]) if m else 0,
        "objects": len(m["objects"]) if m else 0,
    }


def build_index(save: dict, records: list[dict]) -> dict:
    """The step index (format 5) of a save (`save`: step, save_id, root_id, world_size, kind,
    base_step, metadata, library) from every rank's record; checked as a reader checks it."""
    index = {
        "format": layout.MANIFEST_FORMAT,
        "format_version": layout.RANKS_VERSION,
        "index": True,
        **{k: save[k] for k in _COPIED if k != "created_at"},
        "created_at": time.time(),
        "metadata": save["metadata"],
        "library": save.get("library", {}),
        "ranks": sorted(records, key=lambda r: r["rank"]),
    }
    validate_index(index)
    return index


# -- validation ----------------------------------------------------------------------------------
def _fail(where: str, what: str):
    raise mf.ManifestError(f"step index field {where}: {what}")


def _int(v, where: str, lo: int, hi: int) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        _fail(where, f"expected an integer in [{lo}, {hi}], got {v!r:.80}")
    return v


def validate_index(doc) -> dict:
    """Check a parsed step index: header fields as a manifest's, and exactly one record per
    rank 0..world_size-1, each naming that rank's manifest of this save."""
    if not is_index(doc) or doc.get("format") != layout.MANIFEST_FORMAT:
        _fail("<root>", "not a ckptflow step index")
    if doc.get("format_version") != layout.RANKS_VERSION:
        _fail("format_version", f"expected {layout.RANKS_VERSION}")
    _int(doc.get("step"), "step", 0, layout.MAX_STEP)
    world = _int(doc.get("world_size"), "world_size", 1, MAX_RANKS)
    save_id = doc.get("save_id")
    if not (isinstance(save_id, str) and layout.SAVE_ID_RE.match(save_id)):
        _fail("save_id", "expected a save id")
    if not isinstance(doc.get("root_id"), str) or len(doc["root_id"]) > 64:
        _fail("root_id", "expected a root id")
    if doc.get("kind") not in ("full", "delta"):
        _fail("kind", "expected full or delta")
    if doc.get("base_step") is not None:
        _int(doc["base_step"], "base_step", 0, layout.MAX_STEP)
    if not isinstance(doc.get("metadata"), dict) or not isinstance(doc.get("library"), dict):
        _fail("metadata", "expected objects for metadata and library")
    created = doc.get("created_at")
    if isinstance(created, bool) or not isinstance(created, int | float):
        _fail("created_at", "expected a time in epoch seconds")
    if not 0 <= created <= mf.MAX_TIME:
        _fail("created_at", "expected a time in epoch seconds")
    ranks = doc.get("ranks")
    if not isinstance(ranks, list) or len(ranks) != world:
        _fail("ranks", f"expected one record per rank ({world})")
    for r, rec in enumerate(ranks):
        where = f"ranks[{r}]"
        if not isinstance(rec, dict) or not set(rec) >= _RECORD_KEYS:
            _fail(where, f"expected an object with {', '.join(sorted(_RECORD_KEYS))}")
        if _int(rec["rank"], f"{where}.rank", 0, world - 1) != r:
            _fail(f"{where}.rank", "records must list ranks 0..world_size-1 in order")
        if rec["manifest"] != layout.rank_manifest_name(save_id, r):
            _fail(f"{where}.manifest", f"expected {layout.rank_manifest_name(save_id, r)}")
        if not isinstance(rec["xxh3"], str) or len(rec["xxh3"]) > 64:
            _fail(f"{where}.xxh3", "expected a checksum")
        _int(rec["bytes"], f"{where}.bytes", 0, mf.MAX_MANIFEST)
        _int(rec["items"], f"{where}.items", 0, 1 << 40)
        _int(rec["objects"], f"{where}.objects", 0, 1 << 40)
    return doc


def parse_index(blob: bytes, url: str) -> dict:
    """A step index's bytes parsed and checked (CorruptCheckpoint naming `url` otherwise)."""
    try:
        if len(blob) > MAX_INDEX:
            raise mf.ManifestError(f"step index larger than {MAX_INDEX} bytes")
        return validate_index(mf.load(blob))
    except mf.ManifestError as exc:
        raise CorruptCheckpoint(f"{url}: {exc}", [url]) from None


# -- reading rank manifests ----------------------------------------------------------------------
def read_rank(
    storage: Storage, step: int, index: dict, rank: int, only: set[str] | None = None
) -> tuple[dict, int]:
    """Rank `rank`'s manifest of the indexed save, checked against its record in the index
    (size, checksum) and the index's save (step, save id, root id, world size, rank), and
    validated for the FQNs `only` (partial: its chunks need not cover a tensor). With its size."""
    rec = index["ranks"][rank]
    rel = f"{layout.step_dir(step)}/{rec['manifest']}"
    url = storage.url(rel)
    try:
        blob = storage.read(rel, limit=rec["bytes"] + 1)
    except FileNotFoundError:
        raise FileMissing(
            f"{url}: rank manifest named by the step index is missing", [url]
        ) from None
    if len(blob) != rec["bytes"] or codec.digest(blob) != rec["xxh3"]:
        raise CorruptCheckpoint(f"{url}: rank manifest checksum does not match the index", [url])
    try:
        m = mf.parse(blob, only, partial=True)
    except mf.ManifestError as exc:
        raise CorruptCheckpoint(f"{url}: {exc}", [url]) from None
    if m["format_version"] != layout.RANKS_VERSION:
        raise CorruptCheckpoint(f"{url}: not a format {layout.RANKS_VERSION} rank manifest", [url])
    for key in ("step", "save_id", "root_id", "world_size", "kind", "base_step"):
        if m.get(key) != index[key]:  # a mix of two saves (or a forged file) is refused
            raise CorruptCheckpoint(
                f"{url}: rank manifest's {key} {m.get(key)!r:.40} differs from the step "
                f"index's {index[key]!r:.40} (a file of another save)",
                [url],
            )
    if m.get("rank") != rank:
        raise CorruptCheckpoint(f"{url}: rank manifest of rank {m.get('rank')!r:.20}", [url])
    return m, len(blob)


def merge(index: dict, manifests: list[dict], url: str = "") -> dict:
    """One manifest of the usual shape (format 5) from rank manifests of one save, ascending
    by rank. An item (replicated: every rank wrote it) found in several keeps the lowest rank's
    copy, as DCP's deduplication keeps one; objects and tensors must agree where they meet."""
    tensors: dict = {}
    values: set = set()
    items: dict = {}
    objects: dict = {}
    planner: dict = {}
    stats = {"raw_bytes": 0, "new_bytes": 0, "compressed_bytes": 0}
    mode = None
    for m in manifests:
        for fqn, t in m["tensors"].items():
            have = tensors.setdefault(fqn, {"dtype": t["dtype"], "size": t["size"], "chunks": []})
            if (have["dtype"], have["size"]) != (t["dtype"], t["size"]):
                raise CorruptCheckpoint(
                    f"{url}: rank manifests disagree on tensor {fqn!r:.80}'s dtype or size", [url]
                )
            for c in t["chunks"]:
                if mf.item_key(fqn, c["offsets"], layout.RANKS_VERSION) not in items:
                    have["chunks"].append(c)
        for key, it in m["items"].items():
            items.setdefault(key, it)
        values.update(m["values"])
        for key, rec in m["objects"].items():
            if objects.setdefault(key, rec)["size"] != rec["size"]:
                raise CorruptCheckpoint(f"{url}: rank manifests disagree on object {key}", [url])
        for key, path in (m.get("planner_data") or {}).items():
            planner.setdefault(key, path)
        for key in ("raw_bytes", "new_bytes"):
            stats[key] += m["stats"][key]
        comp = m["stats"].get("compression")
        if comp is not None:
            mode = mode or comp["mode"]
            stats["compressed_bytes"] += comp["compressed_bytes"]
    out = {
        "format": layout.MANIFEST_FORMAT,
        "format_version": layout.RANKS_VERSION,
        **{k: index[k] for k in _COPIED},
        "library": index["library"],
        "metadata": index["metadata"],
        "tensors": tensors,
        "values": sorted(values),
        "items": items,
        "objects": objects,
        "planner_data": planner,
        "rank_manifests": index["world_size"],
        "stats": {
            "raw_bytes": stats["raw_bytes"],
            "stored_bytes": sum(o["size"] for o in objects.values()),
            "new_bytes": stats["new_bytes"],
        },
    }
    if mode is not None:
        out["stats"]["compression"] = {"mode": mode, "compressed_bytes": stats["compressed_bytes"]}
    return out


def read_merged(
    storage: Storage, step: int, index: dict, url: str, only: set[str] | None = None
) -> dict:
    """Every rank manifest of the indexed save, merged and validated as one manifest (`url`:
    the index's, named when the merge is unsound: chunks of two ranks overlap or leave a gap)."""
    parts = [read_rank(storage, step, index, r, only)[0] for r in range(index["world_size"])]
    merged = merge(index, parts, url)
    try:
        return mf.validate(merged, only)
    except mf.ManifestError as exc:
        raise CorruptCheckpoint(
            f"{url}: its rank manifests do not fit together ({exc})", [url]
        ) from None

"""The JSON manifest: its schema, and validating it strictly (torch-free).

A manifest is untrusted input (it may be corrupt, foreign or crafted). `validate` checks every
field's type and range before anything uses it, so a hostile manifest is rejected before any
read outside the root, any large allocation or any code execution. Converting to and from DCP's
`Metadata` (torch) lives beside the writer and reader: ckptflow.steps.checkpoint.dcp_metadata.
"""

from __future__ import annotations

import json
import math

from ckptflow.core import deltas, jsonfile, layout, tiling

MAX_BYTES = 1 << 44  # 16 TiB: larger sizes in a manifest are corrupt or hostile
MAX_MANIFEST = 512 * 1024 * 1024
MAX_DIMS = 16
MAX_CHUNKS = 1 << 20
MAX_VALUE = 256 * 1024 * 1024  # as safe_value.MAX_BLOB: the largest non-tensor value
MAX_DEPTH = 128  # JSON nesting: the format needs 7 levels, the rest is room for user metadata
MAX_TIME = 1e11  # epoch seconds (year 5138): a later creation time is corrupt or hostile
# How a save chose to compress (stats.compression.mode, adaptive.mode): forced on or off, or
# `auto` compressing always (object storage, billed by the byte) or where it is faster.
COMPRESSION_MODES = ("on", "off", "auto:always", "auto:adaptive")
MAX_PACK = 64 << 20  # the largest object packed parts may share (a reader holds it whole)

# Bytes per element of each dtype a manifest may name, without torch (bfloat16 and the float8
# types have no numpy dtype): the validator checks stored sizes against shapes with it.
ITEMSIZE = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "complex64": 8,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


class ManifestError(ValueError):
    """The manifest is malformed, of an unknown version, or unsafe."""


def item_key(fqn: str, offset, version: int = layout.FORMAT_VERSION) -> str:
    """The manifest key of a DCP storage item: the FQN with `%` and `@` escaped (`%25`,
    `%40`), then `@` and the chunk offsets for a tensor chunk. The one `@` left separates
    them, so every (fqn, offsets) has its own key (version 1 keys were `fqn@offsets`
    unescaped: a tensor `a` at [0] and a value `a@0` shared the key `a@0`)."""
    if version >= 2:
        fqn = fqn.replace("%", "%25").replace("@", "%40")
    return fqn if offset is None else f"{fqn}@{','.join(str(int(o)) for o in offset)}"


def dumps(manifest: dict) -> bytes:
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()


def check_metadata(metadata: dict) -> None:
    """Refuse user metadata the manifest reader would refuse (not JSON, nested too deeply, an
    integer too long), before anything is written: never commit a checkpoint that cannot load."""
    if not isinstance(metadata, dict):
        raise ManifestError(f"metadata must be a dict, not {type(metadata).__name__}")
    try:
        blob = json.dumps(metadata).encode()
        jsonfile.loads(blob, what="metadata", max_bytes=MAX_MANIFEST, max_depth=MAX_DEPTH - 1)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ManifestError(f"metadata is not plain JSON ({type(exc).__name__}: {exc})") from None
    except jsonfile.BadJsonFile as exc:
        raise ManifestError(f"metadata cannot be stored: {exc.reason}") from None


# -- validation ----------------------------------------------------------------------------------
def _fail(where: str, what: str):
    raise ManifestError(f"manifest field {where}: {what}")


def _int(v, where: str, lo: int = 0, hi: int = MAX_BYTES) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        _fail(where, f"expected an integer in [{lo}, {hi}], got {v!r:.80}")
    return v


def _str(v, where: str, maxlen: int = 4096) -> str:
    if not isinstance(v, str) or len(v) > maxlen:
        _fail(where, "expected a string")
    return v


def _ints(v, where: str) -> list[int]:
    if not isinstance(v, list) or len(v) > MAX_DIMS:
        _fail(where, "expected a short list of integers")
    return [_int(x, where, 0, 1 << 40) for x in v]


def _planes(v, where: str, width: int) -> int:
    if not isinstance(v, list) or len(v) not in (1, width):
        _fail(where, "bad plane table")
    total = 0
    for p in v:
        if not (isinstance(p, list) and len(p) == 2 and p[0] in ("raw", "zstd")):
            _fail(where, "bad plane entry")
        total += _int(p[1], where)
    return total


def _part(p, where: str, objects: dict, version: int) -> int:
    if not isinstance(p, dict):
        _fail(where, "expected an object")
    for ref in (p, p.get("base")):
        if ref is None:
            continue
        if not isinstance(ref, dict):
            _fail(f"{where}.base", "expected an object or null")
        key = _str(ref.get("object"), f"{where}.object", 64)
        if not layout.KEY_RE.match(key):
            _fail(f"{where}.object", f"not an object key: {key!r:.80}")
        if key not in objects:
            _fail(f"{where}.object", f"{key} missing from the objects table")
        width = _int(ref.get("width"), f"{where}.width", 1, 16)
        if _int(ref.get("stored_size"), f"{where}.stored_size") != objects[key]["size"]:
            _fail(f"{where}.stored_size", "differs from the objects table")
        length = _span(ref, where, version)
        if _planes(ref.get("planes"), f"{where}.planes", width) != length:
            _fail(f"{where}.planes", "plane lengths do not add up to the stored bytes")
        _int(ref.get("raw_size"), f"{where}.raw_size")
    if "base" not in p:  # readers index it: absent is not the same as null
        _fail(f"{where}.base", "missing (null for a full part)")
    _int(p.get("raw_offset"), f"{where}.raw_offset")
    if p.get("base") is not None and p["base"]["raw_size"] != p["raw_size"]:
        _fail(where, "delta and base sizes differ")
    _str(p.get("raw_hash"), f"{where}.raw_hash", 64)
    _delta_kind(p, where, version)
    return p["raw_size"]


def _span(ref: dict, where: str, version: int) -> int:
    """The length of a part's (or a delta base's) stored bytes: its whole object, or the
    `[start, length]` span of an object small parts share (version 4; inside an object of at
    most MAX_PACK bytes, which a reader holds whole)."""
    span = ref.get("span")
    if span is None:
        return ref["stored_size"]
    if version < layout.PACK_VERSION:
        _fail(f"{where}.span", f"packed parts need format version {layout.PACK_VERSION}")
    if not isinstance(span, list) or len(span) != 2:
        _fail(f"{where}.span", "expected [start, length]")
    start, length = (_int(x, f"{where}.span") for x in span)
    if ref["stored_size"] > MAX_PACK or start + length > ref["stored_size"]:
        _fail(f"{where}.span", "outside its object, or in an object too large to share")
    return length


def part_bytes(p: dict) -> int:
    """The stored bytes of a part itself (its span of a shared object, or its object)."""
    span = p.get("span")
    return span[1] if span is not None else p["stored_size"]


def _delta_kind(p: dict, where: str, version: int) -> None:
    """A delta part's kind: absent means XOR (all versions 1-2 wrote); a named kind needs
    version 3, and "sub" whole elements of a width it is defined for (the reader views the
    bytes as integers of that width)."""
    if "delta" not in p:
        return
    kind = p["delta"]
    if p.get("base") is None:
        _fail(f"{where}.delta", "a full part has no delta kind")
    if version < layout.DELTA_KIND_VERSION:
        _fail(f"{where}.delta", f"delta kinds need format version {layout.DELTA_KIND_VERSION}")
    if kind not in deltas.DELTA_KINDS:
        _fail(f"{where}.delta", f"unknown delta kind {kind!r:.40}")
    if kind == "sub" and not deltas.sub_ok(p["width"], p["raw_size"]):
        _fail(f"{where}.delta", "a sub delta needs whole elements 1, 2, 4 or 8 bytes wide")


def validate(m, only: set[str] | None = None, partial: bool = False) -> dict:
    """Check a parsed manifest's structure, types and ranges; return it or raise ManifestError.

    `only`: the FQNs a load reads: their tensors, values and items are checked (everything
    such a reader uses), the entries of other tensors are not (a rank of a sharded job reads
    its own few: checking every rank's entries cost each rank O(ranks x tensors), issue 36).
    `partial`: one rank's manifest (format 5, ckptflow.core.rankmanifest): its chunks must lie
    inside their tensors without overlapping, but cover only that rank's shards."""
    if not isinstance(m, dict):
        _fail("<root>", "expected a JSON object")
    if m.get("format") != layout.MANIFEST_FORMAT:
        _fail("format", "not a ckptflow manifest")
    version = m.get("format_version")
    if (
        not isinstance(version, int)
        or isinstance(version, bool)
        or version not in layout.READ_VERSIONS
    ):
        _fail(
            "format_version",
            f"unknown version {version!r:.40}; this ckptflow reads versions "
            f"{', '.join(map(str, layout.READ_VERSIONS))} "
            "(upgrade ckptflow to read newer checkpoints)",
        )
    _int(m.get("step"), "step", 0, layout.MAX_STEP)
    _int(m.get("world_size"), "world_size", 1, 1 << 24)
    _str(m.get("root_id"), "root_id", 64)
    if m.get("kind") not in ("full", "delta"):
        _fail("kind", "expected full or delta")
    if m.get("base_step") is not None:
        _int(m["base_step"], "base_step", 0, layout.MAX_STEP)
    if not isinstance(m.get("metadata"), dict):
        _fail("metadata", "expected an object")
    objects = m.get("objects")
    if not isinstance(objects, dict):
        _fail("objects", "expected an object")
    for key, rec in objects.items():
        if not layout.KEY_RE.match(key) or not isinstance(rec, dict):
            _fail("objects", f"bad entry {key!r:.80}")
        _int(rec.get("size"), f"objects.{key}.size")
    _validate_entries(m, only, partial)
    _planner_data(m.get("planner_data"))
    _stats(m.get("stats"))
    _slimmed(m.get("slimmed"))
    created = m.get("created_at")  # the listing's commit time when COMMIT has none
    if isinstance(created, bool) or not isinstance(created, int | float):
        _fail("created_at", "expected a time in epoch seconds")
    if not 0 <= created <= MAX_TIME:  # (NaN fails this too)
        _fail("created_at", f"expected a time in [0, {MAX_TIME:.0e}], got {created!r:.40}")
    return m


def _stats(v) -> None:
    """The sizes `ckpt ls`, `verify` and the steps report (read without further checks)."""
    if not isinstance(v, dict):
        _fail("stats", "expected an object")
    for key in ("raw_bytes", "stored_bytes", "new_bytes"):
        _int(v.get(key), f"stats.{key}")
    comp = v.get("compression")  # absent in manifests written before issue 36
    if comp is None:
        return
    if not isinstance(comp, dict) or comp.get("mode") not in COMPRESSION_MODES:
        _fail("stats.compression", f"expected a mode of {', '.join(COMPRESSION_MODES)}")
    _int(comp.get("compressed_bytes"), "stats.compression.compressed_bytes")


def _slimmed(v) -> None:
    """A slimmed manifest's record (ckptflow.core.slim): when, which save it came from, what
    it kept. Absent (None) for every manifest a save writes."""
    if v is None:
        return
    if not isinstance(v, dict):
        _fail("slimmed", "expected an object or null")
    for key in ("slim_id", "of_save_id"):
        if not (isinstance(v.get(key), str) and layout.SAVE_ID_RE.match(v[key])):
            _fail(f"slimmed.{key}", "expected a save id")
    at = v.get("at")
    if isinstance(at, bool) or not isinstance(at, int | float) or not 0 <= at <= MAX_TIME:
        _fail("slimmed.at", "expected a time in epoch seconds")
    kept = v.get("kept")
    if not isinstance(kept, list) or len(kept) > 64:
        _fail("slimmed.kept", "expected a short list of prefixes")
    for p in kept:
        _str(p, "slimmed.kept", 256)
    _int(v.get("dropped_entries"), "slimmed.dropped_entries", 0, 1 << 40)
    _int(v.get("dropped_bytes"), "slimmed.dropped_bytes")


def _validate_entries(m: dict, only: set[str] | None = None, partial: bool = False) -> None:
    tensors, values, items = m.get("tensors"), m.get("values"), m.get("items")
    if not isinstance(tensors, dict) or not isinstance(values, list) or not isinstance(items, dict):
        _fail("tensors/values/items", "missing or of the wrong type")
    for fqn, t in tensors.items():
        if only is not None and fqn not in only:
            continue
        _str(fqn, "tensors")
        # (a list or dict as dtype is unhashable: test the type before the table lookup)
        if not isinstance(t, dict) or not isinstance(t.get("dtype"), str):
            _fail(f"tensors.{fqn:.80}", "bad tensor entry or dtype")
        if t["dtype"] not in ITEMSIZE:
            _fail(f"tensors.{fqn:.80}", "bad tensor entry or dtype")
        _chunks(t, f"tensors.{fqn:.80}", items, fqn, m["format_version"], partial)
    for fqn in values:
        _str(fqn, "values")
        if only is not None and fqn not in only:
            continue
        if fqn in tensors:
            _fail(f"values.{fqn:.80}", "also a tensor")
        if item_key(fqn, None, m["format_version"]) not in items:
            _fail(f"values.{fqn:.80}", "value without an item")
    for key, it in items.items():
        if not isinstance(it, dict) or not isinstance(it.get("parts"), list) or not it["parts"]:
            _fail(f"items.{key:.80}", "expected an object with parts")
        fqn = _str(it.get("fqn"), f"items.{key:.80}.fqn")
        if only is not None and fqn not in only:
            continue
        parts = it["parts"]
        where = f"items.{key:.80}.parts"
        raw = sum(_part(p, where, m["objects"], m["format_version"]) for p in parts)
        if it.get("offset") is None:
            if fqn not in values or key != item_key(fqn, None, m["format_version"]):
                _fail(f"items.{key:.80}", "value item without a values entry")
            # A value is decoded whole in memory: never allocate more than a value may hold.
            if raw > MAX_VALUE:
                _fail(f"items.{key:.80}", f"value of {raw} bytes exceeds {MAX_VALUE}")
            continue
        if fqn not in tensors:
            _fail(f"items.{key:.80}", "tensor item without a tensors entry")
        sizes = _ints(it.get("sizes"), f"items.{key:.80}.sizes")
        # Readers look items up by (fqn, offset): the key must say the same.
        offs = _ints(it.get("offset"), f"items.{key:.80}.offset")
        if key != item_key(fqn, offs, m["format_version"]):
            _fail(f"items.{key:.80}", "key does not match the item's fqn and offset")
        if raw != math.prod(sizes) * ITEMSIZE[tensors[fqn]["dtype"]]:
            _fail(f"items.{key:.80}", "stored parts do not match the chunk's size")


def _chunks(t: dict, where: str, items: dict, fqn: str, version: int, partial=False) -> None:
    """Chunks tile the tensor exactly and each has the item that stores it (DCP reads chunks
    by their offsets: a chunk without its item, outside the tensor, overlapping another or
    leaving a gap must fail here)."""
    size = _ints(t.get("size"), f"{where}.size")
    chunks = t.get("chunks")
    if not isinstance(chunks, list) or len(chunks) > MAX_CHUNKS:
        _fail(f"{where}.chunks", "expected a list")
    boxes = []
    for c in chunks:
        if not isinstance(c, dict):
            _fail(f"{where}.chunks", "expected objects with offsets and sizes")
        offs = _ints(c.get("offsets"), f"{where}.chunks.offsets")
        sizes = _ints(c.get("sizes"), f"{where}.chunks.sizes")
        if not (len(offs) == len(sizes) == len(size)) or any(
            o + n > d for o, n, d in zip(offs, sizes, size, strict=True)
        ):
            _fail(f"{where}.chunks", "chunk outside the tensor")
        it = items.get(item_key(fqn, offs, version))
        found = (it.get("fqn"), it.get("offset"), it.get("sizes")) if isinstance(it, dict) else ()
        if found != (fqn, offs, sizes):
            _fail(f"{where}.chunks", "chunk without a matching item")
        boxes.append((offs, sizes))
    # Chunks that overlap or leave a gap would leave part of the tensor unloaded, silently
    # (volumes alone add up with a chunk listed twice).
    problem = tiling.problem(size, boxes, cover=not partial)
    if problem:
        _fail(f"{where}.chunks", problem)


def _planner_data(v) -> None:
    if v is None:
        return
    if not isinstance(v, dict):
        _fail("planner_data", "expected an object")
    for key, path in v.items():
        if not isinstance(path, list) or len(path) > 256:
            _fail(f"planner_data.{key:.80}", "expected a list of keys")
        for k in path:
            if not isinstance(k, str | int) or isinstance(k, bool):
                _fail(f"planner_data.{key:.80}", "expected string or integer keys")


def load(blob: bytes):
    """Manifest bytes as parsed JSON, bounded (size, depth, numbers), not yet validated."""
    if len(blob) > MAX_MANIFEST:
        raise ManifestError("manifest too large")
    try:
        return jsonfile.loads(blob, what="manifest", max_bytes=MAX_MANIFEST, max_depth=MAX_DEPTH)
    except jsonfile.BadJsonFile as exc:
        raise ManifestError(f"manifest is not usable JSON ({exc.reason})") from None


def parse(blob: bytes, only: set[str] | None = None, partial: bool = False) -> dict:
    """Parse and validate manifest bytes (`only`, `partial`: see validate)."""
    return validate(load(blob), only, partial)


def referenced_objects(m: dict) -> set[str]:
    """Every object key a manifest needs (its own, deduplicated ones, and delta bases)."""
    return set(m["objects"])

"""The JSON manifest: its schema, and validating it strictly (torch-free).

A manifest is untrusted input (it may be corrupt, foreign or crafted). `validate` checks every
field's type and range before anything uses it, so a hostile manifest is rejected before any
read outside the root, any large allocation or any code execution. Converting to and from DCP's
`Metadata` (torch) lives beside the writer and reader: ckptflow.steps.checkpoint.dcp_metadata.
"""

from __future__ import annotations

import json
import math

from ckptflow.core import jsonfile, layout

MAX_BYTES = 1 << 44  # 16 TiB: larger sizes in a manifest are corrupt or hostile
MAX_MANIFEST = 512 * 1024 * 1024
MAX_DIMS = 16
MAX_CHUNKS = 1 << 20
MAX_VALUE = 256 * 1024 * 1024  # as safe_value.MAX_BLOB: the largest non-tensor value
MAX_DEPTH = 128  # JSON nesting: the format needs 7 levels, the rest is room for user metadata
MAX_TIME = 1e11  # epoch seconds (year 5138): a later creation time is corrupt or hostile

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


def item_key(fqn: str, offset) -> str:
    """The manifest key of a DCP storage item: fqn, plus chunk offsets for tensors."""
    return fqn if offset is None else f"{fqn}@{','.join(str(int(o)) for o in offset)}"


def dumps(manifest: dict) -> bytes:
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()


def check_metadata(metadata: dict) -> None:
    """Refuse user metadata the manifest reader would refuse (not JSON, nested too deeply, an
    integer too long), before anything is written: never commit a checkpoint that cannot load."""
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


def _part(p, where: str, objects: dict) -> int:
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
        if _planes(ref.get("planes"), f"{where}.planes", width) != objects[key]["size"]:
            _fail(f"{where}.planes", "plane lengths do not add up to the object size")
        if _int(ref.get("stored_size"), f"{where}.stored_size") != objects[key]["size"]:
            _fail(f"{where}.stored_size", "differs from the objects table")
        _int(ref.get("raw_size"), f"{where}.raw_size")
    if "base" not in p:  # readers index it: absent is not the same as null
        _fail(f"{where}.base", "missing (null for a full part)")
    _int(p.get("raw_offset"), f"{where}.raw_offset")
    if p.get("base") is not None and p["base"]["raw_size"] != p["raw_size"]:
        _fail(where, "delta and base sizes differ")
    _str(p.get("raw_hash"), f"{where}.raw_hash", 64)
    return p["raw_size"]


def validate(m) -> dict:
    """Check a parsed manifest's structure, types and ranges; return it or raise ManifestError."""
    if not isinstance(m, dict):
        _fail("<root>", "expected a JSON object")
    if m.get("format") != layout.MANIFEST_FORMAT:
        _fail("format", "not a ckptflow manifest")
    version = m.get("format_version")
    if version != layout.FORMAT_VERSION:
        _fail(
            "format_version",
            f"unknown version {version!r:.40}; this ckptflow reads "
            f"version {layout.FORMAT_VERSION} (upgrade ckptflow to read newer checkpoints)",
        )
    _int(m.get("step"), "step", 0, 1 << 62)
    _int(m.get("world_size"), "world_size", 1, 1 << 24)
    _str(m.get("root_id"), "root_id", 64)
    if m.get("kind") not in ("full", "delta"):
        _fail("kind", "expected full or delta")
    if m.get("base_step") is not None:
        _int(m["base_step"], "base_step", 0, 1 << 62)
    if not isinstance(m.get("metadata"), dict):
        _fail("metadata", "expected an object")
    objects = m.get("objects")
    if not isinstance(objects, dict):
        _fail("objects", "expected an object")
    for key, rec in objects.items():
        if not layout.KEY_RE.match(key) or not isinstance(rec, dict):
            _fail("objects", f"bad entry {key!r:.80}")
        _int(rec.get("size"), f"objects.{key}.size")
    _validate_entries(m)
    _planner_data(m.get("planner_data"))
    _stats(m.get("stats"))
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


def _validate_entries(m: dict) -> None:
    tensors, values, items = m.get("tensors"), m.get("values"), m.get("items")
    if not isinstance(tensors, dict) or not isinstance(values, list) or not isinstance(items, dict):
        _fail("tensors/values/items", "missing or of the wrong type")
    for fqn, t in tensors.items():
        _str(fqn, "tensors")
        # (a list or dict as dtype is unhashable: test the type before the table lookup)
        if not isinstance(t, dict) or not isinstance(t.get("dtype"), str):
            _fail(f"tensors.{fqn:.80}", "bad tensor entry or dtype")
        if t["dtype"] not in ITEMSIZE:
            _fail(f"tensors.{fqn:.80}", "bad tensor entry or dtype")
        _chunks(t, f"tensors.{fqn:.80}", items, fqn)
    for fqn in values:
        _str(fqn, "values")
        if fqn not in items:
            _fail(f"values.{fqn:.80}", "value without an item")
    for key, it in items.items():
        if not isinstance(it, dict) or not isinstance(it.get("parts"), list) or not it["parts"]:
            _fail(f"items.{key:.80}", "expected an object with parts")
        fqn = _str(it.get("fqn"), f"items.{key:.80}.fqn")
        raw = sum(_part(p, f"items.{key:.80}.parts", m["objects"]) for p in it["parts"])
        if it.get("offset") is None:
            if fqn not in values or key != fqn:
                _fail(f"items.{key:.80}", "value item without a values entry")
            # A value is decoded whole in memory: never allocate more than a value may hold.
            if raw > MAX_VALUE:
                _fail(f"items.{key:.80}", f"value of {raw} bytes exceeds {MAX_VALUE}")
            continue
        if fqn not in tensors:
            _fail(f"items.{key:.80}", "tensor item without a tensors entry")
        sizes = _ints(it.get("sizes"), f"items.{key:.80}.sizes")
        # Readers look items up by (fqn, offset): the key must say the same.
        if key != item_key(fqn, _ints(it.get("offset"), f"items.{key:.80}.offset")):
            _fail(f"items.{key:.80}", "key does not match the item's fqn and offset")
        if raw != math.prod(sizes) * ITEMSIZE[tensors[fqn]["dtype"]]:
            _fail(f"items.{key:.80}", "stored parts do not match the chunk's size")


def _chunks(t: dict, where: str, items: dict, fqn: str) -> None:
    """Chunks lie inside the tensor and each has the item that stores it (DCP reads chunks by
    their offsets: a chunk without its item, or outside the tensor, must fail here)."""
    size = _ints(t.get("size"), f"{where}.size")
    chunks = t.get("chunks")
    if not isinstance(chunks, list) or len(chunks) > MAX_CHUNKS:
        _fail(f"{where}.chunks", "expected a list")
    volume = 0
    for c in chunks:
        if not isinstance(c, dict):
            _fail(f"{where}.chunks", "expected objects with offsets and sizes")
        offs = _ints(c.get("offsets"), f"{where}.chunks.offsets")
        sizes = _ints(c.get("sizes"), f"{where}.chunks.sizes")
        if not (len(offs) == len(sizes) == len(size)) or any(
            o + n > d for o, n, d in zip(offs, sizes, size, strict=True)
        ):
            _fail(f"{where}.chunks", "chunk outside the tensor")
        it = items.get(item_key(fqn, offs))
        found = (it.get("fqn"), it.get("offset"), it.get("sizes")) if isinstance(it, dict) else ()
        if found != (fqn, offs, sizes):
            _fail(f"{where}.chunks", "chunk without a matching item")
        volume += math.prod(sizes)
    # Chunks that do not cover the tensor would leave part of it unloaded, silently.
    if volume != math.prod(size):
        _fail(f"{where}.chunks", "chunks do not cover the tensor")


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


def parse(blob: bytes) -> dict:
    """Parse and validate manifest bytes."""
    if len(blob) > MAX_MANIFEST:
        raise ManifestError("manifest too large")
    try:
        doc = jsonfile.loads(blob, what="manifest", max_bytes=MAX_MANIFEST, max_depth=MAX_DEPTH)
    except jsonfile.BadJsonFile as exc:
        raise ManifestError(f"manifest is not usable JSON ({exc.reason})") from None
    return validate(doc)


def referenced_objects(m: dict) -> set[str]:
    """Every object key a manifest needs (its own, deduplicated ones, and delta bases)."""
    return set(m["objects"])

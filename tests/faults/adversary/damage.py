"""The adversary's damage library: what a hostile or failing storage does to a checkpoint root.

Every function works through `Storage` (local disk and S3 alike) on one file, or a pair, and
returns a one-line description for the log. Damage to data files: delete, truncate, flip a
byte keeping the size, empty, swap two files, replace one with another valid object, duplicate
one under a new name, shadow one by a folder, put a file where its shard folder was. Damage to
JSON files (root marker, COMMIT, manifest, saving intent, ARCHIVED, PIN, eval.json): delete,
tear (half of its bytes, written in place), flip a byte, nest (50,000 levels deep: `json.loads`
raises RecursionError), inflate (a 5,000-digit integer: `json.loads` raises ValueError), forge a
field with a value of the wrong type, replace with another valid file of the same kind, plant
where none was. Step folders: swap, copy, delete, a file in the way. A forged manifest can be made
consistent: its COMMIT's checksum rewritten to match, so the damage reaches the validator.
"""

from __future__ import annotations

import json
import posixpath

from ckptflow.core import codec, layout
from ckptflow.core.storage import Storage
from ckptflow.core.storage_errors import StorageError

NEST_DEPTH = 50_000
HUGE_INT = "9" * 5000
_SLOT = '"__hostile_slot__"'

# Values a forged field takes; the raw ones cannot come out of json.dumps in Python.
HOSTILE_RAW = {
    "nest": "[" * NEST_DEPTH + "]" * NEST_DEPTH,
    "inflate": HUGE_INT,
    "inf": "1e999",
}
HOSTILE = {
    "string": "yesterday",
    "list": [1, 2],
    "dict": {"x": {"y": 1}},
    "null": None,
    "negative": -1e308,
    "bool": True,
}
HOSTILE_KINDS = tuple(sorted([*HOSTILE_RAW, *HOSTILE]))

# Fields each kind of JSON file carries (forging one of them keeps the rest of the file).
FIELDS = {
    "root marker": ("format", "version", "root_id", "created_at", "parent"),
    "COMMIT": ("save_id", "manifest_xxh3", "committed_at", "step", "manifest"),
    "manifest": ("created_at", "stats", "stats.stored_bytes", "stats.new_bytes", "kind",
                 "base_step", "metadata", "world_size", "library"),
    "intent": ("save_id", "started_at", "world_size"),
    "ARCHIVED": ("uri", "archived_at", "id"),
    "PIN": ("reason", "pinned_at"),
    "eval.json": ("metrics", "metrics.loss", "step", "evaluated_at"),
}  # fmt: skip


def read_or_none(st: Storage, rel: str) -> bytes | None:
    try:
        return st.read(rel)
    except FileNotFoundError:
        return None
    except (OSError, StorageError):  # a folder where a file was expected, and the like
        return None


# -- bytes -----------------------------------------------------------------------------------------
def flipped(blob: bytes, n: int) -> bytes:
    """`blob` with one byte changed at a position chosen by `n` (same size; never a no-op)."""
    if not blob:
        return b"\x00"
    pos = n % len(blob)
    b = bytearray(blob)
    b[pos] ^= 1 << (n % 8)
    return bytes(b)


def torn(blob: bytes) -> bytes:
    """The first half of a file: what an in-place write that died half-way leaves."""
    return blob[: len(blob) // 2]


def delete(st: Storage, rel: str) -> str:
    st.delete([rel])
    return f"deleted {rel}"


def truncate(st: Storage, rel: str) -> str:
    blob = read_or_none(st, rel) or b""
    st.write(rel, torn(blob))
    return f"truncated {rel} to {len(blob) // 2} of {len(blob)} bytes"


def empty(st: Storage, rel: str) -> str:
    st.write(rel, b"")
    return f"emptied {rel}"


def flip(st: Storage, rel: str, n: int) -> str:
    blob = read_or_none(st, rel) or b""
    st.write(rel, flipped(blob, n))
    return f"flipped a byte of {rel} (same size, {len(blob)} bytes)"


def swap(st: Storage, a: str, b: str, st_b: Storage | None = None) -> str:
    st_b = st_b or st
    blob_a, blob_b = read_or_none(st, a), read_or_none(st_b, b)
    if blob_a is None or blob_b is None:
        return f"swap of {a} and {b}: one is missing, nothing done"
    st.write(a, blob_b)
    st_b.write(b, blob_a)
    return f"swapped {a} and {b}"


def replace(st: Storage, rel: str, blob: bytes, source: str) -> str:
    st.write(rel, blob)
    return f"replaced {rel} with {source}"


def shadow(st: Storage, rel: str) -> str:
    """A folder where the file was (locally: reads fail with IsADirectoryError); on S3 a key
    below it, so the name is both an object and a prefix."""
    if st.protocol == "file":
        st.delete([rel])
        st.write(f"{rel}/shadow", b"x")
        return f"replaced {rel} by a folder"
    st.write(f"{rel}/shadow", b"x")
    return f"put a key below {rel} (an object and a prefix at once)"


def shard_in_the_way(st: Storage, rel: str) -> str:
    """The object's shard folder `objects/<xx>` replaced by a file (its objects gone): a save
    writing an object there fails locally; on S3 the name is an object and a prefix."""
    shard = rel.rsplit("/", 1)[0]
    st.delete([e.path for e in st.walk(shard)])
    st.write(shard, b"not a folder")
    return f"replaced the shard folder {shard} by a file"


def duplicate_object(st: Storage, rel: str, n: int) -> str:
    """A copy of an object under another key: garbage no manifest names (GC frees it)."""
    blob = read_or_none(st, rel) or b""
    key = f"{n:032x}"[-32:]
    st.write(layout.object_path(key), blob)
    return f"duplicated {rel} as {layout.object_path(key)}"


# -- JSON ------------------------------------------------------------------------------------------
def hostile_doc(doc, field: str, how: str) -> bytes:
    """`doc` with `field` (dotted) set to a hostile value; the whole document when it is not
    an object or `field` is empty."""
    if not isinstance(doc, dict) or not field:
        return (HOSTILE_RAW.get(how) or json.dumps(HOSTILE[how])).encode()
    doc = json.loads(json.dumps(doc))  # a copy
    node, *path = field.split(".")
    target = doc
    keys = [node, *path]
    for k in keys[:-1]:
        if not isinstance(target.get(k), dict):
            target[k] = {}
        target = target[k]
    target[keys[-1]] = "__hostile_slot__" if how in HOSTILE_RAW else HOSTILE[how]
    text = json.dumps(doc)
    if how in HOSTILE_RAW:
        text = text.replace(_SLOT, HOSTILE_RAW[how], 1)
    return text.encode()


def parse(blob: bytes | None):
    try:
        return json.loads(blob) if blob is not None else None
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None


def forge(st: Storage, rel: str, field: str, how: str) -> str:
    """Forge one field of a JSON file (or the whole file when `field` is '')."""
    st.write(rel, hostile_doc(parse(read_or_none(st, rel)), field, how))
    return f"forged {rel}: {field or 'whole document'} = {how}"


def rehash_commit(st: Storage, step: int, manifest_blob: bytes) -> None:
    """Make a step's COMMIT match a forged manifest (a consistent forgery reaches the parser)."""
    rel = layout.commit_path(step)
    doc = parse(read_or_none(st, rel))
    if isinstance(doc, dict):
        doc["manifest_xxh3"] = codec.digest(manifest_blob)
        st.write(rel, json.dumps(doc).encode())


def forge_manifest(st: Storage, step: int, rel: str, field: str, how: str) -> str:
    """Forge a field of a committed step's manifest and re-hash its COMMIT to match."""
    blob = hostile_doc(parse(read_or_none(st, rel)), field, how)
    st.write(rel, blob)
    rehash_commit(st, step, blob)
    return f"forged {rel} consistently (COMMIT re-hashed): {field or 'whole document'} = {how}"


def forge_list_manifest(st: Storage, step: int, rel: str) -> str:
    """A list-shaped manifest (`[manifest]`), COMMIT re-hashed to match."""
    doc = parse(read_or_none(st, rel))
    blob = json.dumps([doc]).encode()
    st.write(rel, blob)
    rehash_commit(st, step, blob)
    return f"forged {rel} as a list holding the manifest (COMMIT re-hashed)"


def forge_duplicate_chunk(st: Storage, step: int, rel: str) -> str:
    """A manifest whose 2x3 tensor `w` lists the same 1x3 chunk twice, stored by the 3-element
    tensor `bias`'s part: every count adds up, so only a no-overlap check refuses it; loaded,
    row 1 of `w` is never written. COMMIT re-hashed to match."""
    m = parse(read_or_none(st, rel))
    try:
        bias_part = dict(m["items"]["bias@0"]["parts"][0], raw_offset=0)
        half = {"offsets": [0, 0], "sizes": [1, 3]}
        m["tensors"]["w"]["chunks"] = [half, dict(half)]
        m["items"]["w@0,0"] = {"fqn": "w", "offset": [0, 0], "sizes": [1, 3], "parts": [bias_part]}
    except (TypeError, KeyError, IndexError):
        return (
            f"duplicate-chunk forgery of {rel}: not a manifest of the expected shape, nothing done"
        )
    blob = json.dumps(m, sort_keys=True, separators=(",", ":")).encode()
    st.write(rel, blob)
    rehash_commit(st, step, blob)
    return f"forged {rel}: chunk [0:1] of w listed twice, row 1 uncovered (COMMIT re-hashed)"


# -- folders ---------------------------------------------------------------------------------------
def folder_files(st: Storage, folder: str) -> dict[str, bytes]:
    """Every file of a step folder: name -> bytes."""
    out = {}
    for e in st.walk(folder):
        blob = read_or_none(st, e.path)
        if blob is not None:
            out[posixpath.relpath(e.path, folder)] = blob
    return out


def _clear(st: Storage, folder: str) -> None:
    st.delete([e.path for e in st.walk(folder)])


def swap_folders(st: Storage, a: int, b: int) -> str:
    fa, fb = layout.step_dir(a), layout.step_dir(b)
    files_a, files_b = folder_files(st, fa), folder_files(st, fb)
    _clear(st, fa)
    _clear(st, fb)
    for name, blob in files_b.items():
        st.write(f"{fa}/{name}", blob)
    for name, blob in files_a.items():
        st.write(f"{fb}/{name}", blob)
    return f"swapped the step folders {fa} and {fb}"


def duplicate_folder(st: Storage, src: int, dst: int) -> str:
    fs, fd = layout.step_dir(src), layout.step_dir(dst)
    for name, blob in folder_files(st, fs).items():
        st.write(f"{fd}/{name}", blob)
    return f"copied step folder {fs} to {fd}"


def delete_folder(st: Storage, step: int) -> str:
    _clear(st, layout.step_dir(step))
    return f"deleted the step folder {layout.step_dir(step)}"


def file_in_the_way(st: Storage, step: int) -> str:
    """A file where a step folder will be (a save of that step then cannot create its folder
    locally; on S3 the name is an object and a prefix at once)."""
    st.write(layout.step_dir(step), b"not a folder")
    return f"planted a file named {layout.step_dir(step)}"


def plant_pending(st: Storage, step: int, how: str) -> str:
    """An uncommitted step folder holding a hostile manifest (GC reads those: a save about to
    commit protects its objects through its manifest)."""
    rel = f"{layout.step_dir(step)}/{layout.manifest_name('0123456789abcdef')}"
    blob = b"[1, 2, 3]" if how == "list" else hostile_doc(None, "", how)
    st.write(rel, blob)
    return f"planted an uncommitted {rel} holding a {how} document"

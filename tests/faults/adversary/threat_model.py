"""The adversary's threat model as data: what it attacks, how, what it runs, what must hold.

docs/reliability.md's "Threat model" section is rendered from this (by
scripts/reliability_report.py, which must not need torch: this module imports nothing).
"""

from __future__ import annotations

# (what is attacked, how) -- the damage of damage.py and attacks.py, and the hostile timing
# and crashes of tools.py and machine.py.
ATTACKS = (
    (
        "data files (`objects/`, hot and archive root)",
        "deleted, truncated, emptied, one byte flipped keeping the size, swapped with another "
        "object, replaced by another valid object of this run or of another run, duplicated "
        "under another key, shadowed by a folder of the same name",
    ),
    (
        "root marker `ckptflow-root.json` (hot and archive root)",
        "deleted, torn (the first half, as an in-place write that died leaves it), one byte "
        "flipped, a field or the whole document forged (50,000-deep nesting, a 5,000-digit "
        "integer, 1e999, a string, list, object, null, bool or -1e308 where another type "
        "belongs), replaced by another run's marker or the other root's; later restored from a "
        "backup, as an error's fix says",
    ),
    (
        "`COMMIT`",
        "deleted, torn, flipped, a field forged as above (save_id, manifest_xxh3, committed_at, "
        "step, manifest), replaced by another step's COMMIT or another run's; planted in a "
        "folder without one",
    ),
    (
        "manifest",
        "deleted, torn, flipped, a field forged as above (created_at, stats, kind, base_step, "
        "metadata, ...); forged *consistently* (its COMMIT re-hashed to match, so the forgery "
        "reaches the validator): a hostile field, a list-shaped manifest, a tensor chunk listed "
        "twice (every count adds up, part of the tensor is never written), another step's or "
        "another run's manifest",
    ),
    ("saving intent `saving-<id>.json`", "deleted, torn, flipped, forged, replaced"),
    (
        "`ARCHIVED`",
        "planted or overwritten pointing at a path that does not exist, an `http://` URI, "
        "another run's root, the hot root itself or an alias of it, the archive root; a hostile "
        "field; torn by an archive run that dies while writing it",
    ),
    ("`PIN`, `eval.json`", "deleted, torn, flipped, forged as above, replaced, planted"),
    (
        "uncommitted step folders",
        "a pending manifest that is list-shaped, a JSON object of the wrong shape, 50,000 "
        "levels deep or holding a 5,000-digit integer",
    ),
    (
        "step folders",
        "two swapped, one copied to a step number still to come, one deleted, a file where a "
        "coming step's folder will be",
    ),
    (
        "root identity",
        "`archive --to` another spelling of the hot root (a symlink, a `//` path); an `ARCHIVED` "
        "marker naming one",
    ),
    (
        "time",
        "`gc --grace 0` (and 1h) while an async save is held just before its manifest or its "
        "COMMIT; the save then goes on",
    ),
    (
        "processes",
        "a save or an archive run dies at its N-th write (or delete) of one kind: root marker, "
        "intent, object, manifest, COMMIT, ARCHIVED; a local in-place write leaves half of its "
        "bytes, an exclusive create or an S3 PUT nothing",
    ),
    ("state dicts", "a tensor `a` next to a value named `a@0` (its item key); a load into float64"),
)

OPERATIONS = (
    "saves (sync and async, full and delta through `full_every` 1-3, deduplicated through "
    "tensors that stay frozen, with or without a trainer restart first), loads (the newest from "
    "a fresh process and from the trainer, a given step, into another dtype), `ckptflow ckpt` "
    "ls, ls --verify, verify, pin, unpin, gc (`last=1..3`, `--grace 0` and 1h), archive "
    "(`--older-than 0` to the archive root or to an alias of the hot root), an evaluator "
    "writing eval.json, a user restoring the root marker; on local disk and on the in-process "
    "S3 server"
)

# The model's ground truth: for each committed step its exact state dict and every file it
# depends on with its commit-time digest. Data-intact: every one of those files except the
# root markers unchanged; intact: the root markers too. Any changed byte counts, so the model
# only ever demands too little.
INVARIANTS = (
    ("a", "a load that succeeds returns exactly the bytes (dtype, shape, values) saved for "
     "the step it reports"),
    ("b", "the newest intact step is loadable: `load()` returns it or a newer step, and "
     "`ckpt ls` lists it as committed"),
    ("c", "gc never breaks a data-intact step it must keep (the newest, unless a newer step "
     "still loads exactly; one with fewer than N committed folders above it under `last=N`; "
     "a pinned one; the base of a kept delta) and never leaves a step committed without its "
     "files; archive, whole or dying at any write, never breaks a data-intact step"),
    ("d", "every `ckptflow ckpt` call exits 0, 1 or 2 without a traceback, and an error names "
     "a file; the Python API raises only CheckpointError/StorageError naming a file"),
    ("e", "a save that reports success committed an intact step that loads back exactly, "
     "under the root id of the intact steps already there (none is orphaned)"),
    ("f", "verify, ls and ls --verify never call a step sound when an object it needs is "
     "missing, of the wrong size, or (reading every byte) of other content"),
)  # fmt: skip

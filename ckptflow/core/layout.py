"""Names of everything stored under a checkpoint root (see docs/format.md).

<root>/ckptflow-root.json            root marker: format and a random root id
<root>/objects/<k[:2]>/<k>           content-addressed data (k = xxh3-128 of the stored bytes)
<root>/step-<8 digits>/saving-<id>.json   written when a save starts (GC leaves it alone)
<root>/step-<8 digits>/manifest-<id>.json JSON manifest of that save (format 5, per-rank
                                          manifests: the step index naming the rank manifests)
<root>/step-<8 digits>/manifest-<id>-r<rank, 5+ digits>.json  one rank's manifest (format 5)
<root>/step-<8 digits>/COMMIT        commit marker, written last, exclusively
<root>/step-<8 digits>/ARCHIVED      the step lives in an archive root (JSON: its URI)
<root>/step-<8 digits>/SLIM          weights only: names the slimmed manifest (ckptflow.core.marks)
<root>/step-<8 digits>/CORRUPT       a drill or verify found the step bad: no reader uses it

A step folder also holds the files the run adds (PIN, eval.json, evaluator claims): their
names and readers are in ckptflow.core.runroot.
"""

from __future__ import annotations

import re

# 2: item keys escape `%` and `@` in FQNs (see manifest.item_key); 3: a delta part names its
# kind, "xor" or "sub" (see deltas.DELTA_KINDS; versions 1-2 deltas are all XOR)
# 5: per-rank manifests (a step index names one manifest per rank: ckptflow.core.rankmanifest);
# saves with one manifest still write version 4, which ckptflow 4-format readers read
FORMAT_VERSION = 4
RANKS_VERSION = 5  # the version of a step index, its rank manifests and their merged view
READ_VERSIONS = (1, 2, 3, 4, 5)  # manifest versions this ckptflow reads
DELTA_KIND_VERSION = 3  # the first version whose delta parts may name a kind
PACK_VERSION = 4  # the first version whose small parts may share an object (a `span` of it)
MAX_STEP = 1 << 62  # the largest step a manifest may carry (writers refuse larger ones)
ROOT_MARKER = "ckptflow-root.json"
ROOT_FORMAT = "ckptflow-checkpoint-root"
MANIFEST_FORMAT = "ckptflow-manifest"
OBJECTS = "objects"
COMMIT = "COMMIT"
ARCHIVED = "ARCHIVED"
SLIM = "SLIM"
CORRUPT = "CORRUPT"

# A save in progress refreshes its intent at least this often (its heartbeat, 4 per lease);
# GC takes an intent not refreshed for this long for a crashed save's (ckptflow.core.intent).
SAVE_LEASE_S = 120.0

STEP_PREFIX = "step-"  # how every step folder's name begins
STEP_RE = re.compile(r"^step-(\d{8,})$")
KEY_RE = re.compile(r"^[0-9a-f]{32}$")
SAVE_ID_RE = re.compile(r"^[0-9a-f]{8,32}$")


def step_dir(step: int) -> str:
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    return f"step-{step:08d}"


def parse_step_dir(name: str) -> int | None:
    m = STEP_RE.match(name)
    return int(m.group(1)) if m else None


def object_path(key: str) -> str:
    if not KEY_RE.match(key):
        raise ValueError(f"invalid object key {key!r}")
    return f"{OBJECTS}/{key[:2]}/{key}"


def manifest_name(save_id: str) -> str:
    return f"manifest-{save_id}.json"


def rank_manifest_name(save_id: str, rank: int) -> str:
    """One rank's manifest of a save written with per-rank manifests (format 5)."""
    return f"manifest-{save_id}-r{rank:05d}.json"


RANK_MANIFEST_RE = re.compile(r"^manifest-([0-9a-f]{8,32})-r(\d{5,8})\.json$")


def saving_name(save_id: str) -> str:
    return f"saving-{save_id}.json"


def commit_path(step: int) -> str:
    return f"{step_dir(step)}/{COMMIT}"

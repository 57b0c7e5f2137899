"""Memoization (`template.memoize`) with a local cache that outlives a run.

Argo keeps each cache in a ConfigMap (workflow/controller/cache/configmap_cache.go): one
entry per key, `{"nodeID", "outputs", "creationTimestamp", "lastHitTimestamp"}`. Here a cache
is a directory, `CACHE_DIR/NAMESPACE/CACHE_NAME/KEY.json`, one file per entry in the same
format, replaced atomically, so parallel nodes saving different keys never clobber each other
and a run killed mid-save leaves the old entry. The rules are Argo's
(workflow/controller/operator.go executeTemplate and the Save in podReconciliation):

- the key (substituted with the template's inputs) must match `^[a-zA-Z0-9][-a-zA-Z0-9]*$`
  (cache.go cacheKeyRegex), else the node is Error;
- an entry is a hit when it exists and, with `maxAge` (a Go duration), is not older than it
  (cache.go GetOutputsWithMaxAge); a hit node is Succeeded at once with the cached outputs
  and `memoizationStatus.hit: true`, and its template does not run;
- a miss runs the template; when the node Succeeds its outputs are saved under the key.

A damaged entry (not JSON, too big) makes the node Error naming the file, as Argo's
"malformed cache entry"; the file is left for the user to look at or delete.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ckptflow.workflows.runner.nodes import rfc3339
from ckptflow.workflows.runner.substitution import TAG, to_str

__all__ = ["MemoError", "Memo", "default_dir", "lookup", "problems", "save"]

KEY = re.compile(r"^[a-zA-Z0-9][-a-zA-Z0-9]*$")  # cache.go cacheKeyRegex
# a ConfigMap name (a DNS subdomain) and a namespace (a DNS label): safe as path components
NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_KEY, MAX_NAME = 253, 253
MAX_ENTRY = 1 << 20  # a ConfigMap holds at most 1 MiB
_GO_DURATION = re.compile(r"^(\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class MemoError(ValueError):
    """A memoize block or cache entry that cannot be used (one line; the node's Error)."""


def go_duration(text: str) -> float:
    """Seconds of a Go duration (`time.ParseDuration`: every number needs a unit, "0" aside)."""
    rest, total = text.strip(), 0.0
    if rest == "0":
        return 0.0
    sign = -1.0 if rest.startswith("-") else 1.0
    rest = rest.lstrip("+-")
    if not rest:
        raise MemoError(f"invalid maxAge {text!r}: a Go duration such as 10s, 5m or 1h")
    while rest:
        m = _GO_DURATION.match(rest)
        if m is None:
            raise MemoError(f"invalid maxAge {text!r}: a Go duration such as 10s, 5m or 1h")
        total += float(m.group(1)) * _UNIT[m.group(3)]
        rest = rest[m.end() :]
    return sign * total


def problems(memoize: Any) -> list[tuple[str, str]]:
    """(field, why) for a template's `memoize` block, before anything runs."""
    if not isinstance(memoize, dict):
        return [("memoize", "expected a mapping with key and cache.configMap.name")]
    out = []
    for k in memoize:
        if k not in ("key", "maxAge", "cache"):
            out.append((f"memoize.{k}", "not a memoize field (key, maxAge, cache)"))
    if not isinstance(memoize.get("key"), str) or not memoize["key"]:
        out.append(("memoize.key", "missing: the cache key (e.g. {{inputs.parameters.x}})"))
    cache = memoize.get("cache")
    name = (cache.get("configMap") or {}).get("name") if isinstance(cache, dict) else None
    if not isinstance(name, str) or not NAME.match(name) or len(name) > MAX_NAME:
        out.append(("memoize.cache.configMap.name", f"{name!r} is not a ConfigMap name"))
    age = memoize.get("maxAge")
    if age is not None and "{{" not in to_str(age):
        try:
            go_duration(to_str(age))
        except MemoError as exc:
            out.append(("memoize.maxAge", str(exc)))
    return out


def default_dir(workdir: str) -> str:
    """The cache directory when none is given: beside the run's workdir (so the runs of one
    `runs/local/` share it, as the workflows of one namespace share a ConfigMap)."""
    return str(Path(workdir).resolve().parent / "memo-cache")


class Memo:
    """The memoization of one node: where its entry is, and the status Argo records."""

    def __init__(self, root: str, namespace: str, memoize: dict) -> None:
        key, name = to_str(memoize.get("key")), to_str((memoize["cache"]["configMap"])["name"])
        left = TAG.search(key)
        if left:
            raise MemoError(f"memoize.key: failed to resolve {left.group(0)}")
        if not KEY.match(key) or len(key) > MAX_KEY:
            raise MemoError(f"invalid cache key: {key}")  # configmap_cache.go load
        if not NAMESPACE.match(namespace):
            raise MemoError(f"namespace {namespace!r} cannot name a cache directory")
        age = memoize.get("maxAge")
        self.max_age = None if age in (None, "") else go_duration(to_str(age))
        self.key, self.cache_name = key, name
        self.path = Path(root) / namespace / name / f"{key}.json"

    def status(self, hit: bool) -> dict:
        """`node.memoizationStatus` (workflow_types.go MemoizationStatus)."""
        return {"hit": hit, "key": self.key, "cacheName": self.cache_name}


def _parse_time(text: Any) -> float:
    try:
        return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError as exc:
        raise MemoError(f"bad timestamp {text!r}") from exc


def _write(path: Path, entry: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".entry-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f)
        os.replace(tmp, path)  # atomic: a reader sees the old entry or the new one
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def lookup(memo: Memo, now: float | None = None) -> dict | None:
    """The cached outputs of a hit (`{}` for a node that had none), or None for a miss.
    A hit's `lastHitTimestamp` is updated, as Argo's Load does. MemoError for a damaged one."""
    now = time.time() if now is None else now
    try:
        with open(memo.path, "rb") as f:
            raw = f.read(MAX_ENTRY + 1)
    except FileNotFoundError:
        return None  # "config map cache miss: entry does not exist"
    except OSError as exc:
        raise MemoError(f"cache entry {memo.path}: {exc.strerror}") from exc
    try:
        if len(raw) > MAX_ENTRY:
            raise ValueError(f"over {MAX_ENTRY} bytes")
        entry = json.loads(raw)
        if not isinstance(entry, dict) or not isinstance(entry.get("nodeID", ""), str):
            raise ValueError("not a cache entry")
        outputs = entry.get("outputs") or {}
        if not isinstance(outputs, dict):
            raise ValueError("outputs is not a mapping")
        created = _parse_time(entry.get("creationTimestamp"))
    except (ValueError, MemoError) as exc:
        raise MemoError(f"malformed cache entry {memo.path}: {exc}") from exc
    if not entry.get("nodeID"):  # cache.go Entry.Hit
        return None
    if memo.max_age is not None and now - created > memo.max_age:
        return None  # expired: GetOutputsWithMaxAge
    entry["lastHitTimestamp"] = rfc3339(now)
    try:
        _write(memo.path, entry)
    except OSError as exc:
        raise MemoError(f"cache entry {memo.path}: {exc}") from exc
    return outputs


def save(memo: Memo, node_id: str, outputs: dict | None, now: float | None = None) -> None:
    """Save a succeeded node's outputs under its key (configmap_cache.go save)."""
    stamp = rfc3339(time.time() if now is None else now)
    entry = {
        "nodeID": node_id,
        "outputs": outputs or {},
        "creationTimestamp": stamp,
        "lastHitTimestamp": stamp,
    }
    try:
        _write(memo.path, entry)
    except OSError as exc:
        raise MemoError(f"error creating cache entry {memo.path}: {exc}") from exc

"""The one storage module: a root URI on local disk, `memory://`, `s3://`, `gs://` (Google Cloud
Storage) or `az://`/`abfs://` (Azure Blob), through fsspec (s3fs, gcsfs, adlfs).

Every path argument is relative to the root. Writes are direct (never a rename on an object
store: there a rename is a copy plus a delete); `exclusive=True` creates a file only if it does
not exist yet (O_EXCL plus a hard link locally, `If-None-Match: *` on S3 and Azure,
`ifGenerationMatch=0` on GCS), which is how a commit marker is claimed by one writer only, and
`atomic=True` replaces a small marker file whole (a local temporary file put in place with
os.replace; an object store's put is atomic already).
Errors a user can cause (missing bucket, wrong credentials) become `StorageError` naming the fix.
How to reach S3 or a GCS emulator is given as `StorageOptions` by the caller (see
ckptflow.core.storage_fs, which opens the filesystem for a URI); this module reads no environment (ckptflow.env does, for the entry points; the cloud libraries read their own
credentials, see ckptflow.core.storage_clouds).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import threading
import time
from dataclasses import dataclass

import fsspec

import ckptflow.core.localfs as localfs
import ckptflow.core.localio as localio
import ckptflow.core.retry as retry
import ckptflow.core.storage_clouds as storage_clouds
from ckptflow.core.storage_errors import (
    AlreadyExists,
    StorageError,
    missing_bucket,
    precondition_failed,
    raise_translated,
    range_unsatisfiable,
    transient,
    translated,
)
from ckptflow.core.storage_fs import StorageOptions, filesystem_for
from ckptflow.core.uris import OBJECT_STORES, join_path, split_uri

MULTIPART_CHUNK = 8 << 20
# File timestamps advance in clock ticks, not nanoseconds: a file changed later than this after
# a look at it is sure to show a newer change time (see Storage.fingerprint).
SETTLED_NS = 2_000_000_000


@dataclass(frozen=True)
class Entry:
    """One stored file: path relative to the root, size in bytes, modification time (epoch s)."""

    path: str
    size: int
    mtime: float


def is_temporary(name: str) -> bool:
    """True for the hidden temporary file of an atomic write (left behind by a crash)."""
    return localfs.is_temporary(name)


class ReadMeter:
    """Bytes read from a root and the roots reached through it (`child`, `peer`: its steps'
    archive and parent roots), counted where the bytes arrive: `Storage.read` and the object
    reads of ckptflow.core.locator. A restore reports from it what it read from object
    storage (issue 35), measured, not estimated from manifests."""

    def __init__(self):
        self.bytes = 0
        self._lock = threading.Lock()  # the reader's threads add at once

    def add(self, n: int) -> None:
        with self._lock:
            self.bytes += n


class Storage:
    """A checkpoint root (or any prefix) and the filesystem that holds it."""

    def __init__(
        self,
        uri: str,
        fs: fsspec.AbstractFileSystem | None = None,
        options: StorageOptions | None = None,
        meter: ReadMeter | None = None,
    ):
        self.protocol, self._base = split_uri(uri)
        self.uri = uri if "://" in uri else self._base
        self.options = options or StorageOptions()
        self.fs = fs if fs is not None else filesystem_for(uri, self.options)
        self.meter = meter or ReadMeter()

    # -- paths ---------------------------------------------------------------------------------
    def path(self, rel: str = "") -> str:
        """The filesystem path of `rel` (rejecting anything that escapes the root)."""
        return join_path(self._base, rel, self.uri)

    def url(self, rel: str = "") -> str:
        """The full URI of `rel`, as a user would type it."""
        p = self.path(rel)
        return p if self.protocol == "file" else f"{self.protocol}://{p}"

    def location(self) -> tuple[str, ...]:
        """Where this root really is, for telling two roots apart (never their spelling):
        local disk: the real path (symlinks and `..` resolved); S3: the bucket and the
        normalized key; memory: the normalized path."""
        if self.protocol in ("file", "local"):
            return ("file", *os.path.realpath(self._base).strip("/").split("/"))
        norm = posixpath.normpath("/" + self._base).strip("/")
        protocol = "az" if self.protocol in storage_clouds.AZURE else self.protocol
        return (protocol, *[p for p in norm.split("/") if p])

    def contains(self, other: Storage) -> bool:
        """True when `other` is this root or lies inside it (by `location`)."""
        mine, theirs = self.location(), other.location()
        return theirs[: len(mine)] == mine

    def child(self, rel: str) -> Storage:
        """A Storage rooted at `rel` below this one, sharing the filesystem."""
        return Storage(self.url(rel), fs=self.fs, options=self.options, meter=self.meter)

    def peer(self, uri: str) -> Storage:
        """A Storage for another root (an archive or a parent root), reached with this one's
        options: a root found through this one is read the way this one is."""
        return Storage(uri, options=self.options, meter=self.meter)

    def _io(self, fn, *args, **kw):
        """`fn(*args, **kw)` on the backend; on an object store, transient failures (endpoint
        unreachable, throttled) are retried until `options.retry_seconds` (an outage of a
        minute must not fail a save that then costs a pod retry)."""
        if self.protocol in ("file", "local", "memory"):
            return fn(*args, **kw)
        what = f"{getattr(fn, '__name__', 'call')} {self.protocol}://{args[0] if args else ''}"
        deadline = self.options.retry_seconds
        return retry.call(
            lambda: fn(*args, **kw), deadline_s=deadline, transient=transient, what=what
        )

    # -- reads ---------------------------------------------------------------------------------
    def read(self, rel: str, limit: int | None = None) -> bytes:
        """A whole file, or its first `limit` bytes: a reader of a small untrusted file asks
        for one byte more than it accepts, so a huge file costs no more than that."""
        try:
            with translated(self.url(rel)):
                data = self._cat(rel, limit)
            self.meter.add(len(data))
            return data
        except FileNotFoundError:  # absent (translated() names a missing bucket itself)
            if self.protocol == "gs":  # gcsfs says 404 alike for a missing bucket
                self.check_reachable()
            raise

    def _cat(self, rel: str, limit: int | None) -> bytes:
        """The backend's read of a whole file or its first `limit` bytes, untranslated."""
        span = {} if limit is None else {"start": 0, "end": limit}
        try:
            return self._io(self.fs.cat_file, self.path(rel), **span)
        except FileNotFoundError:
            raise
        except Exception as exc:
            if limit is not None and range_unsatisfiable(exc):
                return b""  # the first bytes of an empty object (a damaged one, say)
            raise

    def open(self, rel: str, mode: str = "rb", **kw):
        return self.fs.open(self.path(rel), mode, **kw)

    def exists(self, rel: str) -> bool:
        try:
            return self._io(self.fs.exists, self.path(rel))
        except Exception as exc:
            raise_translated(exc, self.url(rel))

    def is_file(self, rel: str = "") -> bool:
        """True when `rel` (default: the root itself) is a regular file, not a folder/prefix."""
        try:
            return bool(self._io(self.fs.isfile, self.path(rel)))
        except Exception as exc:
            raise_translated(exc, self.url(rel))

    def size(self, rel: str) -> int:
        return int(self._io(self.fs.size, self.path(rel)))

    def fingerprint(self, rel: str) -> tuple | None:
        """A cheap token (no data read) that differs whenever the file at `rel` is rewritten,
        or None where there is none: local disk, (device, inode, size, mtime, ctime) once the
        change time is SETTLED_NS old (a write within the same clock tick as this look could
        leave the timestamps as they were); S3 and Azure, (size, ETag); GCS, (size,
        generation), which changes on every rewrite. FileNotFoundError when absent."""
        path = self.path(rel)
        if self.protocol == "file":
            s = os.stat(path)
            if time.time_ns() - s.st_ctime_ns < SETTLED_NS:
                return None
            return (s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns)
        field = _VERSION_FIELDS.get(self.protocol)
        if field:
            with translated(self.url(rel)):
                info = self._io(self.fs.info, path, refresh=True)
            version = info.get(field)
            return (int(info.get("size") or 0), str(version)) if version else None
        return None

    def mtime(self, rel: str) -> float:
        """A file's modification time by the storage's own clock (the clock GC compares).
        FileNotFoundError when the file is absent; a missing bucket is a StorageError naming
        it (were it "absent", GC would take a root it cannot reach for one with nothing in it)."""
        try:
            with translated(self.url(rel)):
                return _mtime(self._io(self.fs.info, self.path(rel)))
        except FileNotFoundError:
            # gcsfs's and adlfs's info say "not found" alike for a missing bucket or container
            # (no error code to classify): asked only here, where an absent file is rare
            self.check_reachable()
            raise

    def listdir(self, rel: str = "") -> list[str]:
        """Names of the immediate children of `rel` (files and folders); [] when absent."""
        try:
            with translated(self.url(rel)):
                entries = self._io(self.fs.ls, self.path(rel), detail=False, refresh=True)
        except FileNotFoundError:  # absent (translated() names a missing bucket itself)
            if not rel.strip("/"):
                # An empty root is fine; a missing bucket must not read as "no checkpoints".
                self.check_reachable()
            return []
        names = {posixpath.basename(str(e).rstrip("/")) for e in entries} - {""}
        return sorted(n for n in names if not localfs.is_temporary(n))

    def walk(self, rel: str = "", prefix: str = "") -> list[Entry]:
        """Every file below `rel`, recursively, with size and modification time; with `prefix`,
        only those below children of `rel` whose names start with it. On an object store that
        is one paged listing of the keys under `rel/prefix`, not one per child (a root's step
        folders: 1,100 junk folders cost 1,100 listings each time, issue 37)."""
        if prefix and self.protocol not in OBJECT_STORES:
            names = [n for n in self.listdir(rel) if n.startswith(prefix)]
            found = [e for n in names for e in self.walk(f"{rel.rstrip('/')}/{n}".lstrip("/"))]
            return sorted(found, key=lambda e: e.path)
        base = self.path(rel)
        span = {"prefix": prefix} if prefix else {}
        try:
            with translated(self.url(rel)):
                found = self._io(self.fs.find, base, detail=True, withdirs=False, **span)
        except FileNotFoundError:  # absent (translated() names a missing bucket itself)
            return []
        out = []
        prefix = self._base.rstrip("/") + "/"
        for name, info in found.items():
            name = name if name.startswith("/") or self.protocol != "file" else "/" + name
            relname = (
                name[len(prefix) :]
                if name.startswith(prefix)
                else name.lstrip("/")[len(prefix.lstrip("/")) :]
            )
            out.append(Entry(relname, int(info.get("size") or 0), _mtime(info)))
        return sorted(out, key=lambda e: e.path)

    # -- writes --------------------------------------------------------------------------------
    def write(
        self,
        rel: str,
        data,
        *,
        exclusive: bool = False,
        durable: bool = True,
        atomic: bool = False,
        direct: bool = False,
    ) -> None:
        """Write a whole file from bytes or a list of buffers. Large S3 files go up as parallel
        multipart uploads (s3fs). `durable=False` skips the local fsync: the caller then makes
        a batch of files durable at once with `flush()` (one flush instead of one per file).
        `atomic=True` replaces a file so that a reader sees the old or the new one whole, never
        a torn one (a marker that decides what is kept: PIN, eval.json); an exclusive create
        is always atomic. An S3 or memory put is atomic by itself. `direct=True` (one contiguous
        buffer, a new local file) writes it with O_DIRECT where the filesystem allows (durable
        when this returns unless `durable=False`); elsewhere it is ignored."""
        path = self.path(rel)
        if direct and self.protocol == "file" and not (exclusive or atomic):
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                if localio.write_direct(path, data, sync=durable):
                    return
            except Exception as exc:
                raise_translated(exc, self.url(rel))
        if isinstance(data, list) and self.protocol != "file":
            data = b"".join(data)
        try:
            if self.protocol == "file":
                self._write_local(path, data, exclusive, durable, atomic)
            elif self.protocol in storage_clouds.CLOUDS:
                if exclusive:  # refuse rather than let a commit overwrite another writer's
                    storage_clouds.check_conditional_create(
                        self.fs, self.protocol, path, self.url(rel)
                    )
                storage_clouds.put(self.fs, self.protocol, path, bytes(data), exclusive)
            elif self.protocol == "s3":
                # Files over 2 x MULTIPART_CHUNK go up as parallel multipart uploads.
                self._io(
                    self.fs.pipe_file,
                    path,
                    bytes(data) if isinstance(data, memoryview) else data,
                    mode="create" if exclusive else "overwrite",
                    chunksize=MULTIPART_CHUNK,
                )
            else:
                if exclusive and self.fs.exists(path):
                    raise AlreadyExists(f"{self.url(rel)} already exists")
                self.fs.pipe_file(path, bytes(data))
        except (AlreadyExists, StorageError):
            raise
        except Exception as exc:
            # Only an object store's refusal of a conditional create means another writer has
            # the name (a local claim raises AlreadyExists itself, in localfs.write).
            if exclusive and self.protocol in OBJECT_STORES and precondition_failed(exc):
                if self._landed(rel, data):
                    return
                raise AlreadyExists(f"{self.url(rel)} already exists") from exc
            if isinstance(exc, FileNotFoundError) and self.protocol in OBJECT_STORES:
                # A put finds no file missing but its bucket: name that, not "no such file".
                self.check_reachable()
            raise_translated(exc, self.url(rel))

    def _landed(self, rel: str, data: bytes | memoryview) -> bool:
        """True when an exclusive create on an object store lost only its reply: the client
        retried, the retry found the file, and the file holds exactly our bytes (a commit
        marker carries a random save id, so no other writer's marker is ever equal). Without
        this check a commit that succeeded would be reported as lost to another writer."""
        if self.protocol not in OBJECT_STORES:
            return False
        try:
            # at most one byte more than ours: a huge object there costs no more than that
            mine = bytes(data)
            return self.fs.cat_file(self.path(rel), start=0, end=len(mine) + 1) == mine
        except Exception:
            return False

    def _write_local(self, path: str, data, exclusive: bool, durable=True, atomic=False) -> None:
        """A local-disk write (ckptflow.core.localfs); a seam a test overrides to fail as a
        full disk or a missing permission does."""
        localfs.write(path, data, exclusive, durable, atomic)

    def touch(self, rel: str, data: bytes) -> None:
        """Refresh a file's modification time (a save's heartbeat on its intent): local disk
        sets the time, an object store writes the same `data` again (a put is atomic)."""
        if self.protocol == "file":
            try:
                os.utime(self.path(rel))
            except OSError as exc:
                raise_translated(exc, self.url(rel))
            return
        self.write(rel, data)

    def flush(self) -> None:
        """Make every write of this process durable (local disk: one sync for a whole batch)."""
        if self.protocol == "file":
            os.sync()

    def delete(self, rels: list[str]) -> None:
        """Delete files; missing ones are ignored (so an interrupted delete can be repeated)."""
        for rel in rels:
            # translated() names a missing bucket; only an absent file is passed over
            with contextlib.suppress(FileNotFoundError), translated(self.url(rel)):
                self._io(self.fs.rm_file, self.path(rel))

    def check_reachable(self) -> None:
        """Fail early with a clear message when the bucket is missing or credentials are wrong."""
        if self.protocol not in OBJECT_STORES:
            return
        bucket = self._base.split("/", 1)[0]
        where = f"{self.protocol}://{bucket}"
        try:
            self._io(self.fs.ls, bucket, refresh=True)
        except FileNotFoundError as exc:
            raise StorageError(f"{where}: {missing_bucket(self.protocol, bucket)}") from exc
        except Exception as exc:
            raise_translated(exc, where)


# The info field that changes whenever an object is rewritten (see Storage.fingerprint).
_VERSION_FIELDS = {"s3": "ETag", "gs": "generation", "az": "etag", "abfs": "etag"}


def _mtime(info: dict) -> float:
    # s3fs/gcsfs: mtime or LastModified; adlfs: last_modified
    for key in ("mtime", "LastModified", "last_modified", "created"):
        val = info.get(key)
        if val is None:
            continue
        if hasattr(val, "timestamp"):
            return float(val.timestamp())
        return float(val)
    return 0.0

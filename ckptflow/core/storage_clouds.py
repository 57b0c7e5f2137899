"""Google Cloud Storage (gcsfs) and Azure Blob (adlfs) for ckptflow.core.storage: how their
filesystems are opened, how a large file goes up, and the check that an endpoint really honours
the conditional create a commit relies on.

Credentials stay in each cloud's own chain, read by its library from the standard environment
(GOOGLE_APPLICATION_CREDENTIALS or workload identity; AZURE_STORAGE_CONNECTION_STRING, or
AZURE_STORAGE_ACCOUNT_NAME with a key, a SAS token or a managed identity): nothing here reads,
stores or logs them. Retries on transient errors are each library's own (gcsfs: 6 tries with
exponential backoff on 408/429/5xx and connection errors; azure-storage-blob: its default
ExponentialRetry), which adlfs and gcsfs apply to every request, conditional creates included.
"""

from __future__ import annotations

import contextlib
import posixpath
import threading
import uuid

import fsspec

from ckptflow.core.storage_errors import StorageError, precondition_failed

# Upload pieces: a GCS resumable upload sends a file over GCS_CHUNK in pieces of that size (a
# multiple of 256 KiB, as GCS requires); Azure sends a blob over 64 MiB as blocks, up to
# AZURE_CONCURRENCY of them at once, committed by one block list.
GCS_CHUNK = 8 << 20
AZURE_CONCURRENCY = 8
AZURE = ("az", "abfs")
CLOUDS = ("gs", *AZURE)  # the stores this module serves

_checked: set[tuple] = set()  # (filesystem token, bucket) whose conditional creates held
_checked_lock = threading.Lock()


def gcs_filesystem(endpoint: str | None, anonymous: bool) -> fsspec.AbstractFileSystem:
    """gcsfs's core filesystem: not the experimental zonal-bucket class gcsfs exports by
    default, whose bucket-type probe runs over gRPC and whose uploads take another path."""
    from gcsfs.core import GCSFileSystem

    # No listings cache: a listing made earlier in this process would hide a newer object.
    kw: dict = {"use_listings_cache": False}
    if endpoint:
        kw["endpoint_url"] = endpoint
    if anonymous:
        kw["token"] = "anon"  # an emulator takes no credentials (Google's own clients agree)
    return GCSFileSystem(**kw)


def azure_filesystem() -> fsspec.AbstractFileSystem:
    """adlfs's Azure Blob filesystem, its account and credentials from the environment."""
    return fsspec.filesystem("abfs", use_listings_cache=False, max_concurrency=AZURE_CONCURRENCY)


def put(fs, protocol: str, path: str, data: bytes, exclusive: bool) -> None:
    """One whole object; `exclusive`: only if no object has the name (GCS `ifGenerationMatch=0`,
    Azure `If-None-Match: *`), else FileExistsError from the library."""
    mode = "create" if exclusive else "overwrite"
    if protocol == "gs":
        fs.pipe_file(path, data, mode=mode, chunksize=GCS_CHUNK)
    else:
        fs.pipe_file(path, data, mode=mode, max_concurrency=AZURE_CONCURRENCY)


def bucket_of(path: str) -> str:
    return path.split("/", 1)[0]


def check_conditional_create(fs, protocol: str, path: str, url: str) -> None:
    """Refuse to commit on an endpoint that ignores conditional creates (an emulator such as
    gcp-storage-emulator does): two writers would both "win" and the later marker would
    silently replace the earlier one. Checked once per filesystem and bucket by creating a
    hidden probe twice beside `path`; the second create must be refused."""
    key = (getattr(fs, "_fs_token", id(fs)), protocol, bucket_of(path))
    with _checked_lock:
        if key in _checked:
            return
    # A hidden temporary name (see storage.is_temporary): listings skip it, GC removes a
    # probe a crash left behind.
    probe = posixpath.join(
        posixpath.dirname(path), f".{posixpath.basename(path)}.{uuid.uuid4().hex[:12]}.tmp"
    )
    try:
        try:
            put(fs, protocol, probe, b"probe", exclusive=True)
        except Exception as exc:
            # the name is new to everyone: a refusal means our own create's reply was lost
            if not precondition_failed(exc):
                raise
        try:
            put(fs, protocol, probe, b"again", exclusive=True)
        except Exception as exc:
            if not precondition_failed(exc):
                raise
        else:
            raise StorageError(
                f"{url}: this endpoint ignores conditional creates (GCS ifGenerationMatch=0, "
                "Azure If-None-Match: *), so two writers could both commit a step; "
                "use a store that honours them"
            )
    finally:
        # a leftover probe is hidden, and GC removes it
        with contextlib.suppress(Exception):
            fs.rm_file(probe)
    with _checked_lock:
        _checked.add(key)

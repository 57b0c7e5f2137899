"""Root URIs and the paths below them, computed without opening a filesystem (and without
importing fsspec): a local path, file://, memory://, s3://bucket/prefix, gs://bucket/prefix or
az://container/prefix (abfs:// is the same Azure Blob store).

Split from ckptflow.core.storage, whose Storage resolves every relative path through these.
"""

from __future__ import annotations

import os
import posixpath

from ckptflow.core.storage_errors import StorageError


def split_uri(uri: str) -> tuple[str, str]:
    """(scheme, path) of a root URI; a local path is ("file", its absolute path). A scheme this
    module serves spelled without `://` and a name (`s3:/`, `s3:bucket`, `s3://`) is refused:
    read as a local path, it named a folder `s3:` beside the user (issue 37)."""
    if "://" in uri:
        protocol, rest = uri.split("://", 1)
        if protocol.lower() in OBJECT_STORES and (rest.startswith("/") or not rest.strip("/")):
            raise _malformed(uri, protocol.lower())  # no bucket (container) named
        return protocol, rest.rstrip("/")
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else None
    if scheme in PROTOCOLS and scheme != "local":
        raise _malformed(uri, scheme)
    return "file", os.path.abspath(os.path.expanduser(uri))


def _malformed(uri: str, scheme: str) -> StorageError:
    form = {
        "file": "file:///absolute/path (or the path itself)",
        "memory": "memory://name",
        "gs": "gs://BUCKET/PREFIX",
        "az": "az://CONTAINER/PREFIX",
        "abfs": "abfs://CONTAINER/PREFIX",
    }.get(scheme, "s3://BUCKET/PREFIX")
    return StorageError(f"malformed storage URI {uri[:200]!r}: write it as {form}")


def join_path(base: str, rel: str, uri: str) -> str:
    """The filesystem path of `rel` below `base` (rejecting anything that escapes the root)."""
    rel = rel.strip("/")
    norm = posixpath.normpath(rel) if rel else ""
    if norm.startswith("..") or posixpath.isabs(rel):
        raise StorageError(f"path {rel!r} escapes the root {uri}")
    return f"{base}/{norm}" if norm and norm != "." else base


def join_uri(uri: str, rel: str) -> str:
    """The full URI of `rel` below `uri`, as `Storage(uri).url(rel)` gives it, without opening
    a filesystem (names of a run root's parts, computed before anything is read)."""
    protocol, base = split_uri(uri)
    path = join_path(base, rel, uri if "://" in uri else base)
    return path if protocol == "file" else f"{protocol}://{path}"


# the only URI schemes a root may use
PROTOCOLS = ("file", "local", "memory", "s3", "gs", "az", "abfs")
# object stores whose writes go through a conditional create (see ckptflow.core.storage)
OBJECT_STORES = ("s3", "gs", "az", "abfs")


def supported(uri: str) -> bool:
    """True when `uri` is a local path or uses a scheme this module serves (a URI read from a
    file, such as an ARCHIVED marker's, is checked with this before anything is opened)."""
    try:
        return split_uri(uri)[0] in PROTOCOLS
    except StorageError:  # malformed: `s3:/x`, `s3:///x`
        return False

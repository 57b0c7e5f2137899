"""Where artifacts of a local run are kept: the workflow's artifact repository.

Two kinds, both behind one small interface (`put`, `get`, `keys`), so the runner stays
standalone (stdlib + PyYAML):

- `DirRepository(root)`: a local directory, one file per key (the default: `WORKDIR/artifacts`);
- `S3Repository(client, bucket, prefix)`: an S3 bucket through an injected client. The client is
  duck-typed as boto3's S3 client (`upload_file(Filename, Bucket, Key)`, `download_file(Bucket,
  Key, Filename)`, `list_objects_v2(Bucket=, Prefix=, ...)`): the caller builds it (the CLI with
  boto3, pointed at the configured endpoint or the in-process S3 server of `--local`); the runner
  never imports boto3.

Archives follow Argo: an output is a gzipped tar of its path (one top-level entry named after the
path) unless `archive: none`, which stores a file as is and a directory as one key per file under
the artifact's key. Loading detects a gzipped tar and unpacks it (`unpack`), as Argo's executor
does; members that would leave the destination are refused (tarfile's `data` filter).
"""

from __future__ import annotations

import gzip
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "ArtifactError",
    "DirRepository",
    "Repository",
    "S3Repository",
    "pack",
    "unpack",
    "MAX_FILES",
]

MAX_FILES = 100_000  # files of one un-archived directory artifact (bounds a hostile listing)


class ArtifactError(RuntimeError):
    """An artifact could not be saved or loaded; the message names the artifact and the key."""


class Repository(Protocol):
    """The artifact store of a run: keys are `/`-separated object names."""

    def put(self, key: str, src: str) -> None: ...
    def get(self, key: str, dest: str) -> None: ...
    def keys(self, prefix: str) -> list[str]: ...
    def describe(self) -> str: ...


def _check_key(key: str) -> str:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ArtifactError(f"artifact key {key!r} is not a relative object name")
    return key


class DirRepository:
    """A directory holding one file per key."""

    def __init__(self, root: str) -> None:
        self.root = Path(root).resolve()

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def put(self, key: str, src: str) -> None:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)

    def get(self, key: str, dest: str) -> None:
        src = self._path(key)
        if not src.is_file():
            raise ArtifactError(f"no artifact with key {key!r} in {self.root}")
        shutil.copyfile(src, dest)

    def keys(self, prefix: str) -> list[str]:
        base = self._path(prefix.rstrip("/"))
        if not base.is_dir():
            return []
        found = []
        for dirpath, _, files in os.walk(base):
            for f in files:
                found.append(str(Path(dirpath, f).relative_to(self.root)))
                if len(found) > MAX_FILES:
                    raise ArtifactError(f"more than {MAX_FILES} files under {prefix!r}")
        return sorted(found)

    def describe(self) -> str:
        return f"directory {self.root}"


class S3Repository:
    """A bucket (and key prefix) through a boto3-like S3 client."""

    def __init__(self, client: Any, bucket: str, prefix: str = "") -> None:
        self.client, self.bucket, self.prefix = client, bucket, prefix.strip("/")

    def _key(self, key: str) -> str:
        key = _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def put(self, key: str, src: str) -> None:
        try:
            self.client.upload_file(src, self.bucket, self._key(key))
        except Exception as exc:  # botocore's errors are not importable here: report any
            raise ArtifactError(
                f"cannot upload s3://{self.bucket}/{self._key(key)}: {exc}"
            ) from exc

    def get(self, key: str, dest: str) -> None:
        try:
            self.client.download_file(self.bucket, self._key(key), dest)
        except Exception as exc:
            raise ArtifactError(
                f"cannot download s3://{self.bucket}/{self._key(key)}: {exc}"
            ) from exc

    def keys(self, prefix: str) -> list[str]:
        full = self._key(prefix.rstrip("/")) + "/"
        found: list[str] = []
        token = None
        while True:
            kwargs = {"Bucket": self.bucket, "Prefix": full}
            if token:
                kwargs["ContinuationToken"] = token
            try:
                page = self.client.list_objects_v2(**kwargs)
            except Exception as exc:
                raise ArtifactError(f"cannot list s3://{self.bucket}/{full}: {exc}") from exc
            for obj in page.get("Contents") or []:
                key = str(obj["Key"])
                found.append(key[len(self.prefix) + 1 :] if self.prefix else key)
            if len(found) > MAX_FILES:
                raise ArtifactError(f"more than {MAX_FILES} objects under {full!r}")
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return sorted(found)

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def pack(src: str, dest: str, level: int = 6) -> None:
    """A gzipped tar of `src` (file or directory) with one top-level entry, its base name."""
    name = os.path.basename(os.path.normpath(src)) or "artifact"
    with gzip.open(dest, "wb", compresslevel=level) as gz, tarfile.open(fileobj=gz, mode="w") as tf:
        tf.add(src, arcname=name)


def _is_tgz(path: str) -> bool:
    with open(path, "rb") as fh:
        if fh.read(2) != b"\x1f\x8b":
            return False
    try:
        with tarfile.open(path, "r:gz") as tf:
            tf.next()
        return True
    except (tarfile.TarError, OSError, EOFError):
        return False


def unpack(archive: str, dest: str) -> None:
    """Place a downloaded artifact at `dest`: a gzipped tar is unpacked (its single top-level
    entry becomes `dest`, several become the contents of directory `dest`), anything else is
    moved there as a file."""
    if not _is_tgz(archive):
        shutil.move(archive, dest)
        return
    with tempfile.TemporaryDirectory(dir=os.path.dirname(dest) or ".") as tmp:
        try:
            with tarfile.open(archive, "r:gz") as tf:
                tf.extractall(tmp, filter="data")  # refuses absolute paths, `..`, device files
        except (tarfile.TarError, EOFError) as exc:
            raise ArtifactError(f"damaged or unsafe archive: {exc}") from exc
        entries = os.listdir(tmp)
        if len(entries) == 1:
            shutil.move(os.path.join(tmp, entries[0]), dest)
        else:
            os.makedirs(dest, exist_ok=True)
            for e in entries:
                shutil.move(os.path.join(tmp, e), os.path.join(dest, e))

"""Which fsspec filesystem serves a root URI (s3fs, gcsfs, adlfs, local, memory), and
`StorageOptions`, how the caller says S3 and a GCS emulator are reached.

Split from ckptflow.core.storage (the module that wraps fsspec), which opens its filesystem
here; like it, this module reads no environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import fsspec

import ckptflow.core.storage_clouds as storage_clouds
from ckptflow.core.storage_errors import StorageError
from ckptflow.core.uris import PROTOCOLS, split_uri


@dataclass(frozen=True)
class StorageOptions:
    """How to reach S3 (and a GCS emulator): deployment wiring the caller passes in
    (ckptflow.env reads it). Without `credentials`, botocore's own chain finds them
    (environment, profile, instance role); GCS and Azure credentials are always their
    libraries' own (see ckptflow.core.storage_clouds)."""

    endpoint_url: str | None = None  # S3 endpoint (MinIO, moto, ...); None: AWS itself
    region: str | None = None  # S3 region; None: botocore's default
    # (key id, secret) for a private server whose keys are not in this process's environment
    credentials: tuple[str, str] | None = field(default=None, repr=False)
    # how long an unreachable or throttling object store is retried before a call fails
    retry_seconds: float = 120.0
    # GCS endpoint (an emulator: reached without credentials); None: Google Cloud itself
    gcs_endpoint: str | None = None

    def s3_kwargs(self) -> dict:
        """The fsspec/s3fs options these stand for."""
        # No listings cache: fsspec shares one S3 filesystem per option set, so a listing made
        # earlier in this process (ls, gc, an evaluator) would hide an object written since and
        # a save that committed would not load ("data file is missing").
        opts: dict = {"use_listings_cache": False}
        client = {"endpoint_url": self.endpoint_url, "region_name": self.region}
        if any(client.values()):
            opts["client_kwargs"] = {k: v for k, v in client.items() if v}
        if self.credentials:
            opts["key"], opts["secret"] = self.credentials
        return opts


def filesystem_for(uri: str, options: StorageOptions | None = None) -> fsspec.AbstractFileSystem:
    """The fsspec filesystem for a URI (`options`: how to reach S3; default: botocore's)."""
    protocol, _ = split_uri(uri)
    options = options or StorageOptions()
    if protocol == "s3":
        return fsspec.filesystem("s3", **options.s3_kwargs())
    if protocol == "gs":
        return storage_clouds.gcs_filesystem(options.gcs_endpoint, bool(options.gcs_endpoint))
    if protocol in storage_clouds.AZURE:
        return storage_clouds.azure_filesystem()
    if protocol in PROTOCOLS:
        return fsspec.filesystem(protocol)
    raise StorageError(
        f"unsupported storage URI {uri!r}: use a local path, file://, memory://, "
        "s3://bucket/prefix, gs://bucket/prefix or az://container/prefix"
    )

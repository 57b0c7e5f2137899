"""Storage errors and their one classification table (by exception type, errno and the
service's error code: S3's, Azure Blob's, Google Cloud Storage's HTTP status; never by message
text): which backend failures a user can fix, and the fix to name.

Split from ckptflow.core.storage (the module that wraps fsspec), which raises these.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn


class StorageError(RuntimeError):
    """A storage problem the user can fix (bad URI, missing bucket, credentials, full disk);
    `kind` is its row in the table below (None when raised for another reason)."""

    def __init__(self, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind


class AlreadyExists(StorageError):
    """An exclusive create found the file already there."""


# -- error classification ------------------------------------------------------------------------
# One table, by exception type, errno and S3 error code (never by the text of a message: a path
# may contain "412" or "403"). s3fs turns a botocore ClientError into an OSError subclass and
# keeps the ClientError as __cause__, whose response carries the S3 code and HTTP status.
_FIXES = {
    "no-bucket": "the bucket does not exist; create it first (e.g. `aws s3 mb`)",
    "denied": "access denied; check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
    "and the bucket policy ({code})",
    "no-credentials": "no S3 credentials; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
    "throttled": "S3 is throttling or unavailable ({code}); retry later",
    "unreachable": "cannot reach the storage endpoint ({code}); check the URI, "
    "AWS_ENDPOINT_URL and the network",
    "local-denied": "permission denied; check this path's owner and mode, or use a root you "
    "may write",
    "disk-full": "no space left on device; free space or use another root",
    "quota": "disk quota exceeded; free space, raise the quota or use another root",
    "read-only": "read-only file system; use a writable root",
    "not-a-folder": "a path component is a file, not a folder (or the reverse); check the root URI",
    "missing": "no such file or folder (removed while in use?); check the root URI",
    "az-no-container": "the container does not exist; create it first "
    "(e.g. `az storage container create --name NAME`)",
    "az-denied": "access denied; check AZURE_STORAGE_CONNECTION_STRING (or "
    "AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY, a SAS token or a managed "
    "identity) and the container's role assignments ({code})",
    "az-throttled": "Azure Blob storage is throttling or unavailable ({code}); retry later",
    "gcs-no-bucket": "the bucket does not exist; create it first (e.g. `gcloud storage "
    "buckets create gs://NAME`)",
    "gcs-denied": "access denied; check GOOGLE_APPLICATION_CREDENTIALS (or the workload "
    "identity) and the bucket's IAM ({code})",
    "gcs-no-credentials": "no Google Cloud credentials; set GOOGLE_APPLICATION_CREDENTIALS to "
    "a service-account key file or use workload identity",
    "gcs-throttled": "Google Cloud Storage is throttling or unavailable ({code}); retry later",
}
_S3_CODES = {
    "NoSuchBucket": "no-bucket",
    "AccessDenied": "denied",
    "InvalidAccessKeyId": "denied",
    "SignatureDoesNotMatch": "denied",
    "ExpiredToken": "denied",
    "InvalidToken": "denied",
    "AllAccessDisabled": "denied",
    "AccountProblem": "denied",
    "RequestTimeTooSkewed": "denied",
    "403": "denied",
    "SlowDown": "throttled",
    "ServiceUnavailable": "throttled",
    "503": "throttled",
}
_HTTP_STATUS = {403: "denied", 503: "throttled"}  # when the code is one we do not know
_ERRNOS = {
    errno.ENOSPC: "disk-full",
    errno.EDQUOT: "quota",
    errno.EACCES: "local-denied",
    errno.EPERM: "local-denied",
    errno.EROFS: "read-only",
    errno.ENOTDIR: "not-a-folder",
    errno.EISDIR: "not-a-folder",
    errno.EEXIST: "not-a-folder",  # outside a claim (see _claim), a file where a folder goes
    errno.ENOENT: "missing",
}
# Azure Blob error codes (azure-core's HttpResponseError.error_code, kept by adlfs as the
# exception itself or as its __cause__/__context__), then the HTTP status when the code is new.
_AZURE_CODES = {
    "ContainerNotFound": "az-no-container",
    "AuthenticationFailed": "az-denied",
    "AuthorizationFailure": "az-denied",
    "AuthorizationPermissionMismatch": "az-denied",
    "AuthorizationSourceIPMismatch": "az-denied",
    "InvalidAuthenticationInfo": "az-denied",
    "InsufficientAccountPermissions": "az-denied",
    "AccountIsDisabled": "az-denied",
    "ServerBusy": "az-throttled",
    "OperationTimedOut": "az-throttled",
    "InternalError": "az-throttled",
}
_AZURE_STATUS = {401: "az-denied", 403: "az-denied", 503: "az-throttled"}
# Azure's answers to a create with `If-None-Match: *` that found the blob there.
_AZURE_EXISTS = {"BlobAlreadyExists", "ConditionNotMet"}
# Google Cloud Storage: gcsfs's HttpError carries the HTTP status as `.code` (a 403 it raises
# as a bare OSError with no status, which this table cannot tell from other failures).
_GCS_STATUS = {401: "gcs-denied", 403: "gcs-denied", 429: "gcs-throttled", 503: "gcs-throttled"}
# botocore and google-auth exceptions by class name (the core imports neither)
_TYPES = {
    "DefaultCredentialsError": "gcs-no-credentials",
    "RefreshError": "gcs-denied",
    "NoCredentialsError": "no-credentials",
    "PartialCredentialsError": "no-credentials",
    "EndpointConnectionError": "unreachable",
    "ConnectTimeoutError": "unreachable",
    "ConnectionError": "unreachable",  # botocore's, and the built-in one (refused, reset)
}


def s3_error(exc: BaseException) -> tuple[str | None, int | None]:
    """The S3 error code and HTTP status behind `exc` (itself a botocore ClientError, or an
    s3fs OSError caused by one); (None, None) for any other error."""
    seen = 0
    while exc is not None and seen < 8:
        response = getattr(exc, "response", None)
        if isinstance(response, dict):
            code = (response.get("Error") or {}).get("Code")
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            return (str(code) if code is not None else None), status
        exc, seen = exc.__cause__, seen + 1
    return None, None


def _chain(exc: BaseException | None):
    """`exc` and the exceptions behind it (__cause__, else __context__), at most 8."""
    seen = 0
    while exc is not None and seen < 8:
        yield exc
        exc, seen = (exc.__cause__ or exc.__context__), seen + 1


def _named(exc: BaseException, name: str) -> bool:
    return any(cls.__name__ == name for cls in type(exc).__mro__)


def azure_error(exc: BaseException) -> tuple[str | None, int | None]:
    """The Azure Blob error code and HTTP status behind `exc` (an azure-core HttpResponseError,
    or an adlfs error raised while handling one); (None, None) for any other error."""
    for e in _chain(exc):
        if _named(e, "HttpResponseError"):
            code = getattr(e, "error_code", None)
            code = getattr(code, "value", code)  # a StorageErrorCode member or a plain string
            return (str(code) if code else None), getattr(e, "status_code", None)
    return None, None


def gcs_status(exc: BaseException) -> int | None:
    """The HTTP status of a gcsfs HttpError behind `exc`; None for any other error."""
    for e in _chain(exc):
        if _named(e, "HttpError") and isinstance(getattr(e, "code", None), int):
            return e.code
    return None


def classify(exc: BaseException) -> str | None:
    """The kind of a storage error (a key of _FIXES), or None for one the user cannot fix."""
    if isinstance(exc, StorageError):
        return None
    code, status = s3_error(exc)
    if code is not None or status is not None:
        return _S3_CODES.get(code or "") or _HTTP_STATUS.get(status or 0)
    code, status = azure_error(exc)
    if code is not None or status is not None:
        return _AZURE_CODES.get(code or "") or _AZURE_STATUS.get(status or 0)
    status = gcs_status(exc)
    if status is not None:
        return _GCS_STATUS.get(status)
    for cls in type(exc).__mro__:
        if cls.__name__ in _TYPES:
            return _TYPES[cls.__name__]
    return _ERRNOS.get(exc.errno) if isinstance(exc, OSError) else None


# Kinds that pass by themselves: the same call a little later may succeed (retried with backoff
# by ckptflow.core.retry); every other kind needs a person or never passes.
TRANSIENT_KINDS = frozenset({"unreachable", "throttled"})


def transient(exc: BaseException) -> bool:
    """True when `exc` (raw, or a StorageError made from one) is worth retrying."""
    if isinstance(exc, StorageError):
        return exc.kind in TRANSIENT_KINDS
    return classify(exc) in TRANSIENT_KINDS


def range_unsatisfiable(exc: BaseException) -> bool:
    """True when an object store refused a ranged read because the range starts past the
    object's end: S3's InvalidRange/416, Azure's InvalidRange/416, GCS's 416. A read of the
    first bytes of an object gets it only when the object is empty (s3fs raises it as an
    OSError EINVAL, which says nothing by itself)."""
    code, status = s3_error(exc)
    if code == "InvalidRange" or status == 416:
        return True
    code, status = azure_error(exc)
    return code == "InvalidRange" or status == 416 or gcs_status(exc) == 416


def precondition_failed(exc: BaseException) -> bool:
    """True when an object store refused an exclusive create because the object exists: S3's
    412 to `If-None-Match: *`, Azure's BlobAlreadyExists/ConditionNotMet (adlfs raises it as a
    FileExistsError), GCS's 412 to `ifGenerationMatch=0` (gcsfs raises FileExistsError)."""
    code, status = s3_error(exc)
    if code == "PreconditionFailed" or status == 412:
        return True
    code, status = azure_error(exc)
    if code in _AZURE_EXISTS or status in (409, 412):
        return True
    return gcs_status(exc) == 412 or isinstance(exc, FileExistsError)


def translate(exc: BaseException, uri: str) -> BaseException:
    """Turn backend exceptions a user can fix into StorageError with the fix named."""
    kind = classify(exc)
    if kind is None:
        return exc
    code = s3_error(exc)[0] or azure_error(exc)[0] or gcs_status(exc) or type(exc).__name__
    return StorageError(f"{uri}: {_FIXES[kind].format(code=code)}", kind=kind)


def missing_bucket(protocol: str, bucket: str) -> str:
    """The fix for a bucket (an Azure container) that does not exist, in its cloud's words."""
    if protocol == "gs":
        return f"the bucket does not exist; create it first (e.g. `gcloud storage buckets create gs://{bucket}`)"
    if protocol in ("az", "abfs"):
        return f"the container does not exist; create it first (e.g. `az storage container create --name {bucket}`)"
    return f"the bucket does not exist; create it first (e.g. `aws s3 mb s3://{bucket}`)"


def absent(exc: FileNotFoundError) -> bool:
    """True when a FileNotFoundError means the file is absent (s3fs and adlfs raise it for a
    missing bucket or container too, which must never read as "no such file": a root would
    look empty)."""
    return classify(exc) not in ("no-bucket", "az-no-container")


@contextmanager
def translated(url: str) -> Iterator[None]:
    """Backend errors of the block as the caller must see them: a FileNotFoundError that means
    the file is absent passes as itself (the caller decides what absence means); one that
    means a missing bucket or container, and every other error, goes through `translate`
    naming `url` (so a missing bucket never reads as "no such file": a root would look empty).
    """
    try:
        yield
    except FileNotFoundError as exc:
        if absent(exc):
            raise
        raise_translated(exc, url)
    except Exception as exc:
        raise_translated(exc, url)


def raise_translated(exc: Exception, url: str) -> NoReturn:
    """Raise `translate(exc, url)`, caused by `exc`; an error translate leaves as it is is
    raised as itself (raised "from" itself, its own cause would be lost)."""
    err = translate(exc, url)
    if err is exc:
        raise exc
    raise err from exc

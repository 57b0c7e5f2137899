"""Storage errors and their one classification table (by exception type, errno and S3 error
code, never by message text): which backend failures a user can fix, and the fix to name.

Split from ckptflow.core.storage (the module that wraps fsspec), which raises these.
"""

from __future__ import annotations

import errno


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
# botocore exceptions by class name (the core does not import botocore)
_TYPES = {
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


def classify(exc: BaseException) -> str | None:
    """The kind of a storage error (a key of _FIXES), or None for one the user cannot fix."""
    if isinstance(exc, StorageError):
        return None
    code, status = s3_error(exc)
    if code is not None or status is not None:
        return _S3_CODES.get(code or "") or _HTTP_STATUS.get(status or 0)
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


def precondition_failed(exc: BaseException) -> bool:
    """True when S3 refused an exclusive create (`If-None-Match: *`): the object exists."""
    code, status = s3_error(exc)
    return code == "PreconditionFailed" or status == 412


def translate(exc: BaseException, uri: str) -> BaseException:
    """Turn backend exceptions a user can fix into StorageError with the fix named."""
    kind = classify(exc)
    if kind is None:
        return exc
    code = s3_error(exc)[0] or type(exc).__name__
    return StorageError(f"{uri}: {_FIXES[kind].format(code=code)}", kind=kind)


def absent(exc: FileNotFoundError) -> bool:
    """True when a FileNotFoundError means the file is absent (s3fs raises it for a missing
    bucket too, which must never read as "no such file": a root would look empty)."""
    return classify(exc) != "no-bucket"

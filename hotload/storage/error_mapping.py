"""The one place where foreign storage errors (botocore, the OS) become ours.

Every error carries the bucket URL and key as context — never a credential. botocore's
``ClientError`` is mapped by its error code first, then by HTTP status: 404/``NoSuchKey``
→ ``NotFound``; 403 and signature/key errors → ``AccessDenied``; 5xx, throttling and
connection failures → ``StorageUnavailable`` (transient); other 4xx → ``StorageRejected``.
"""

from __future__ import annotations

import errno
from typing import Any, Final

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    NoCredentialsError,
    PartialCredentialsError,
)

from hotload.errors import AccessDenied, NotFound, StorageError, StorageRejected, StorageUnavailable

_NOT_FOUND_CODES: Final = frozenset(
    {"404", "NoSuchKey", "NotFound", "NoSuchBucket", "NoSuchUpload"}
)
_DENIED_CODES: Final = frozenset(
    {
        "403",
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "AllAccessDisabled",
        "AccountProblem",
    }
)
_UNAVAILABLE_CODES: Final = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "InternalError",
        "ServiceUnavailable",
        "XMinioServerNotInitialized",
        "XMinioStorageFull",
        "XMinioReadQuorum",
        "XMinioWriteQuorum",
    }
)


def map_botocore_error(
    err: Exception, *, url: str, key: str | None, operation: str
) -> StorageError:
    """Our error for anything boto3/botocore (or the HTTP stack under it) raised."""
    context: dict[str, Any] = {"url": url, "key": key, "operation": operation}
    if isinstance(err, ClientError):
        error = err.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        context.update(code=code, status=status)
        if code in _NOT_FOUND_CODES or status == 404:
            return NotFound("object not found", **context)
        if code in _DENIED_CODES or status in (401, 403):
            return AccessDenied("the bucket refused our credentials", **context)
        if code in _UNAVAILABLE_CODES or status >= 500 or status in (408, 429):
            return StorageUnavailable("the bucket answered with a server error", **context)
        return StorageRejected(
            f"the bucket refused the request: {error.get('Message', code)}", **context
        )
    if isinstance(err, NoCredentialsError | PartialCredentialsError):
        return AccessDenied("no usable credentials for the bucket", **context)
    if isinstance(err, BotoCoreError | ConnectionError | TimeoutError | OSError):
        return StorageUnavailable(f"the bucket did not answer: {type(err).__name__}", **context)
    # urllib3/http.client errors raised while streaming a body are not BotoCoreErrors.
    return StorageUnavailable(f"reading from the bucket failed: {type(err).__name__}", **context)


def map_os_error(err: OSError, *, url: str, key: str | None, operation: str) -> StorageError:
    """Our error for a failed file operation of a ``file://`` bucket."""
    context: dict[str, Any] = {"url": url, "key": key, "operation": operation, "errno": err.errno}
    if isinstance(err, FileNotFoundError | NotADirectoryError) or err.errno == errno.ENOENT:
        return NotFound("object not found", **context)
    if isinstance(err, PermissionError) or err.errno in (errno.EACCES, errno.EPERM):
        return AccessDenied("the bucket directory refused access", **context)
    if isinstance(err, IsADirectoryError):
        return StorageRejected("the key names a directory, not an object", **context)
    return StorageUnavailable(
        f"the bucket directory failed: {err.strerror or type(err).__name__}", **context
    )

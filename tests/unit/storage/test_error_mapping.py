"""Foreign errors become ours in one place, with the bucket and key as context."""

from __future__ import annotations

import errno

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)

from hotload.errors import (
    AccessDenied,
    NotFound,
    StorageError,
    StorageRejected,
    StorageUnavailable,
)
from hotload.storage.error_mapping import map_botocore_error, map_os_error


def client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": f"{code} happened"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        "GetObject",
    )


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("NoSuchKey", 404, NotFound),
        ("404", 404, NotFound),
        ("NoSuchBucket", 404, NotFound),
        ("AccessDenied", 403, AccessDenied),
        ("InvalidAccessKeyId", 403, AccessDenied),
        ("SignatureDoesNotMatch", 403, AccessDenied),
        ("ExpiredToken", 400, AccessDenied),
        ("SlowDown", 503, StorageUnavailable),
        ("InternalError", 500, StorageUnavailable),
        ("ServiceUnavailable", 503, StorageUnavailable),
        ("RequestTimeout", 400, StorageUnavailable),
        ("TooManyRequests", 429, StorageUnavailable),
        ("SomethingNew", 502, StorageUnavailable),
        ("InvalidArgument", 400, StorageRejected),
    ],
)
def test_client_errors_map_by_code_then_status(
    code: str, status: int, expected: type[StorageError]
) -> None:
    mapped = map_botocore_error(
        client_error(code, status), url="s3://b/p", key="k", operation="get"
    )
    assert type(mapped) is expected
    assert mapped.context["url"] == "s3://b/p"
    assert mapped.context["key"] == "k"
    assert mapped.context["code"] == code


@pytest.mark.parametrize(
    "error",
    [
        EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
        ConnectTimeoutError(endpoint_url="http://127.0.0.1:1"),
        ReadTimeoutError(endpoint_url="http://127.0.0.1:1"),
        ConnectionResetError("reset"),
    ],
)
def test_connection_failures_are_transient_unavailable(error: Exception) -> None:
    mapped = map_botocore_error(error, url="s3://b", key=None, operation="list")
    assert isinstance(mapped, StorageUnavailable)
    assert mapped.transient


def test_missing_credentials_are_access_denied_and_final() -> None:
    mapped = map_botocore_error(NoCredentialsError(), url="s3://b", key="k", operation="get")
    assert isinstance(mapped, AccessDenied)
    assert not mapped.transient


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (FileNotFoundError(errno.ENOENT, "no"), NotFound),
        (PermissionError(errno.EACCES, "no"), AccessDenied),
        (IsADirectoryError(errno.EISDIR, "dir"), StorageRejected),
        (OSError(errno.EIO, "I/O error"), StorageUnavailable),
        (OSError(errno.ENOSPC, "full"), StorageUnavailable),
    ],
)
def test_os_errors_of_file_buckets(error: OSError, expected: type[StorageError]) -> None:
    mapped = map_os_error(error, url="file:///b", key="k", operation="get")
    assert type(mapped) is expected
    assert mapped.context["errno"] == error.errno

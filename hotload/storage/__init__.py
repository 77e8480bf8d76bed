"""Object storage: ``file://`` (the embedded default) and ``s3://`` behind one async interface.

Use :func:`open_storage`; every backend satisfies :class:`Storage`. Errors are the
storage classes of :mod:`hotload.errors` with the URL and key as context. Knows nothing
of Kubernetes or snapshots.
"""

from hotload.retry import NO_RETRY, RetryPolicy
from hotload.storage.bucket_url import BucketUrl, Scheme, check_key, parse_bucket_url
from hotload.storage.credentials import StorageCredentials
from hotload.storage.opener import open_storage
from hotload.storage.protocol import (
    DEFAULT_CONCURRENCY,
    DEFAULT_GET_LIMIT,
    DEFAULT_PART_SIZE,
    DownloadResult,
    ObjectInfo,
    ProgressCallback,
    Storage,
)

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_GET_LIMIT",
    "DEFAULT_PART_SIZE",
    "NO_RETRY",
    "BucketUrl",
    "DownloadResult",
    "ObjectInfo",
    "ProgressCallback",
    "RetryPolicy",
    "Scheme",
    "Storage",
    "StorageCredentials",
    "check_key",
    "open_storage",
    "parse_bucket_url",
]

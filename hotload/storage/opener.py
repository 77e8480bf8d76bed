"""``open_storage``: the one way to get a :class:`Storage` for a bucket URL."""

from __future__ import annotations

from hotload.errors import ConfigError
from hotload.retry import RetryPolicy
from hotload.storage.bucket_url import Scheme, parse_bucket_url
from hotload.storage.credentials import StorageCredentials
from hotload.storage.file_storage import FileStorage
from hotload.storage.protocol import Storage
from hotload.storage.s3_storage import AddressingStyle, S3Storage


def open_storage(
    bucket_url: str,
    *,
    endpoint: str | None = None,
    region: str | None = None,
    credentials: StorageCredentials | None = None,
    profile: str | None = None,
    retry: RetryPolicy | None = None,
    addressing_style: AddressingStyle | None = None,
    max_connections: int = 16,
) -> Storage:
    """A storage for ``file:///abs/prefix`` or ``s3://bucket/prefix``.

    ``endpoint``/``region``/``credentials``/``profile`` apply to ``s3://`` only (an
    endpoint with a ``file://`` URL is a ConfigError: it would be silently ignored
    otherwise). ``profile`` names a boto3 profile (shared config and credentials files);
    with neither credentials nor a profile, boto3's own chain is used (environment,
    instance roles, web identity); nothing here reads the environment itself.
    """
    bucket = parse_bucket_url(bucket_url)
    if bucket.scheme is Scheme.FILE:
        if endpoint is not None:
            raise ConfigError("an endpoint makes no sense for a file:// bucket", url=bucket_url)
        return FileStorage(bucket, retry=retry)
    return S3Storage(
        bucket,
        endpoint=endpoint,
        region=region,
        credentials=credentials,
        profile=profile,
        retry=retry,
        addressing_style=addressing_style,
        max_connections=max_connections,
    )

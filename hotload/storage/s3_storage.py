"""``s3://`` buckets through boto3: AWS, MinIO, Nebius, GCS interop via endpoint settings.

boto3 is synchronous, so every call runs on this storage's own thread pool; one client
per storage object (clients are thread-safe). botocore's own retries are off: ours
(backoff with full jitter, :mod:`hotload.storage.retry`) apply to the read operations and
to every part of a download. Custom endpoints get path-style addressing and checksums
only "when required", which S3-compatible services other than AWS accept.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from hotload.errors import ConfigError, HotloadError, ObjectTooLarge
from hotload.retry import NO_RETRY, RetryPolicy
from hotload.storage.bucket_url import BucketUrl, check_prefix
from hotload.storage.credentials import StorageCredentials
from hotload.storage.error_mapping import map_botocore_error
from hotload.storage.protocol import (
    DEFAULT_GET_LIMIT,
    ObjectInfo,
)
from hotload.storage.ranged_store import RangedReadStore
from hotload.storage.retry import STORAGE_RETRY, call_with_retry

log = logging.getLogger(__name__)
T = TypeVar("T")

AddressingStyle = Literal["auto", "path", "virtual"]


_SESSIONS: dict[str | None, boto3.session.Session] = {}
_SESSIONS_LOCK = threading.Lock()


def _session(profile: str | None) -> boto3.session.Session:
    """One boto3 Session per profile per process, shared by every storage's client.

    A Session parses the S3 service model once (about 12 MiB); a client made from a shared
    one costs a third of a MiB. The runtime's shared mode runs a thousand agents, each
    with its own storage, in one process. Credentials stay per client (passed to
    ``client()``); a storage without them uses the session's default chain, as before.
    """
    session = _SESSIONS.get(profile)
    if session is None:
        session = _SESSIONS[profile] = boto3.session.Session(profile_name=profile)
    return session


class S3Storage(RangedReadStore):
    """A :class:`~hotload.storage.protocol.Storage` over an S3-compatible bucket."""

    def __init__(
        self,
        bucket: BucketUrl,
        *,
        endpoint: str | None = None,
        region: str | None = None,
        credentials: StorageCredentials | None = None,
        profile: str | None = None,
        retry: RetryPolicy | None = None,
        addressing_style: AddressingStyle | None = None,
        max_connections: int = 16,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
    ) -> None:
        if credentials is not None and profile is not None:
            raise ConfigError("give credentials or a profile, not both", url=str(bucket))
        self._bucket = bucket
        self._retry = retry or STORAGE_RETRY
        self._endpoint = endpoint
        style = addressing_style or ("path" if endpoint else "auto")
        config = Config(
            region_name=region,
            retries={"total_max_attempts": 1},
            max_pool_connections=max_connections,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            s3={"addressing_style": style},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        with _SESSIONS_LOCK:  # a boto3 Session is not thread-safe; its clients are
            self._client: Any = _session(profile).client(
                "s3",
                endpoint_url=endpoint,
                region_name=region,
                config=config,
                aws_access_key_id=credentials.access_key_id if credentials else None,
                aws_secret_access_key=credentials.secret_access_key if credentials else None,
                aws_session_token=credentials.session_token if credentials else None,
            )
        self._pool = ThreadPoolExecutor(
            max_workers=max_connections, thread_name_prefix="hotload-s3"
        )

    @property
    def url(self) -> str:
        return str(self._bucket)

    @property
    def endpoint(self) -> str | None:
        return self._endpoint

    async def _call(
        self, func: Callable[[], T], *, key: str | None, operation: str, retry: bool = True
    ) -> T:
        loop = asyncio.get_running_loop()

        async def attempt() -> T:
            try:
                return await loop.run_in_executor(self._pool, func)
            except HotloadError:
                raise
            except Exception as err:
                raise map_botocore_error(err, url=self.url, key=key, operation=operation) from err

        policy = self._retry if retry else NO_RETRY
        return await call_with_retry(attempt, policy, what=f"{operation} {key or ''}")

    async def get(self, key: str, *, max_bytes: int = DEFAULT_GET_LIMIT) -> bytes:
        object_key = self._bucket.object_key(key)

        def read() -> bytes:
            response = self._client.get_object(Bucket=self._bucket.bucket, Key=object_key)
            body = response["Body"]
            try:
                length = int(response.get("ContentLength", 0))
                if length > max_bytes:
                    raise ObjectTooLarge(
                        "object is over the size cap",
                        url=self.url,
                        key=key,
                        size=length,
                        max_bytes=max_bytes,
                    )
                data: bytes = body.read(max_bytes + 1)
            finally:
                body.close()
            if len(data) > max_bytes:
                raise ObjectTooLarge(
                    "object is over the size cap", url=self.url, key=key, max_bytes=max_bytes
                )
            return data

        return await self._call(read, key=key, operation="get")

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        if start < 0 or end < start:
            raise ValueError(f"bad range [{start}, {end})")
        if start == end:
            return b""
        object_key = self._bucket.object_key(key)

        def read() -> bytes:
            try:
                response = self._client.get_object(
                    Bucket=self._bucket.bucket, Key=object_key, Range=f"bytes={start}-{end - 1}"
                )
            except self._client.exceptions.ClientError as err:
                if err.response.get("Error", {}).get("Code") == "InvalidRange":
                    return b""  # past the end: clamped, like a file read
                raise
            body = response["Body"]
            try:
                data: bytes = body.read()
            finally:
                body.close()
            return data

        return await self._call(read, key=key, operation="get_range")

    async def stat(self, key: str) -> ObjectInfo:
        object_key = self._bucket.object_key(key)

        def head() -> ObjectInfo:
            response = self._client.head_object(Bucket=self._bucket.bucket, Key=object_key)
            modified = response.get("LastModified")
            return ObjectInfo(
                key=key,
                size=int(response["ContentLength"]),
                etag=str(response.get("ETag", "")).strip('"') or None,
                modified=modified if isinstance(modified, datetime) else None,
            )

        return await self._call(head, key=key, operation="stat")

    async def put(self, key: str, data: bytes) -> None:
        object_key = self._bucket.object_key(key)
        await self._call(
            lambda: self._client.put_object(Bucket=self._bucket.bucket, Key=object_key, Body=data),
            key=key,
            operation="put",
        )

    async def put_file(self, key: str, src: Path) -> None:
        object_key = self._bucket.object_key(key)
        transfer = TransferConfig(
            multipart_threshold=64 * 1024 * 1024, max_concurrency=4, use_threads=True
        )
        await self._call(
            lambda: self._client.upload_file(
                str(src), self._bucket.bucket, object_key, Config=transfer
            ),
            key=key,
            operation="put_file",
        )

    async def list(self, prefix: str = "") -> list[ObjectInfo]:
        check_prefix(prefix)
        base = f"{self._bucket.prefix}/" if self._bucket.prefix else ""

        def walk() -> list[ObjectInfo]:
            paginator = self._client.get_paginator("list_objects_v2")
            found: list[ObjectInfo] = []
            for page in paginator.paginate(Bucket=self._bucket.bucket, Prefix=base + prefix):
                for item in page.get("Contents", []):
                    full: str = item["Key"]
                    found.append(
                        ObjectInfo(
                            key=full[len(base) :],
                            size=int(item["Size"]),
                            etag=str(item.get("ETag", "")).strip('"') or None,
                            modified=item.get("LastModified"),
                        )
                    )
            return sorted(found, key=lambda info: info.key)

        return await self._call(walk, key=prefix, operation="list")

    async def delete(self, key: str) -> None:
        object_key = self._bucket.object_key(key)
        await self._call(
            lambda: self._client.delete_object(Bucket=self._bucket.bucket, Key=object_key),
            key=key,
            operation="delete",
        )

    async def aclose(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()

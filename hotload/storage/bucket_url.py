"""Parse a bucket URL (``file:///abs/prefix`` or ``s3://bucket/prefix``) and check keys.

Keys are relative to the URL's prefix, ``/``-separated, e.g.
``<identity>/hotload-manifest.json``. A key never starts with ``/`` and never holds an
empty, ``.`` or ``..`` segment, so it cannot escape its prefix on either backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from urllib.parse import unquote, urlsplit

from hotload.errors import ConfigError


class Scheme(StrEnum):
    FILE = "file"
    S3 = "s3"


@dataclass(frozen=True)
class BucketUrl:
    """A parsed bucket URL: the scheme, the bucket (s3 only), and the key prefix."""

    scheme: Scheme
    bucket: str
    """The S3 bucket name; empty for ``file://``."""
    prefix: str
    """For s3: the key prefix without leading or trailing ``/`` (may be empty).
    For file: the absolute directory path."""

    @property
    def root_path(self) -> Path:
        """The directory of a ``file://`` URL."""
        if self.scheme is not Scheme.FILE:
            raise ConfigError("only a file:// bucket has a root path", url=str(self))
        return Path(self.prefix)

    def object_key(self, key: str) -> str:
        """The full S3 object key of ``key`` (prefix + key)."""
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def __str__(self) -> str:
        if self.scheme is Scheme.FILE:
            return f"file://{self.prefix}"
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


def parse_bucket_url(url: str) -> BucketUrl:
    """Parse ``file:///abs/path`` or ``s3://bucket[/prefix]``; anything else is a ConfigError."""
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise ConfigError("a bucket URL takes no query or fragment", url=url)
    if parts.scheme == Scheme.FILE:
        if parts.netloc not in ("", "localhost"):
            raise ConfigError("a file:// bucket URL must be file:///absolute/path", url=url)
        path = unquote(parts.path)
        if not path.startswith("/") or ".." in Path(path).parts:
            raise ConfigError("a file:// bucket URL needs an absolute path without '..'", url=url)
        normalized = str(Path(path))
        return BucketUrl(Scheme.FILE, "", normalized)
    if parts.scheme == Scheme.S3:
        if not parts.netloc:
            raise ConfigError("an s3:// bucket URL names a bucket: s3://bucket/prefix", url=url)
        prefix = unquote(parts.path).strip("/")
        if prefix:
            check_key(prefix)
        return BucketUrl(Scheme.S3, parts.netloc, prefix)
    raise ConfigError("a bucket URL starts with file:// or s3://", url=url)


def check_key(key: str) -> str:
    """Return ``key`` if it is a safe relative key, else raise ConfigError."""
    if not key or key.startswith("/") or "\\" in key or "\x00" in key:
        raise ConfigError("an object key is a non-empty relative path", key=key)
    segments = key.split("/")
    if any(segment in ("", ".", "..") for segment in segments):
        raise ConfigError("an object key may not hold empty, '.' or '..' segments", key=key)
    return key


def check_prefix(prefix: str) -> str:
    """Like :func:`check_key`, but the empty prefix (everything) and a trailing ``/`` are fine."""
    if prefix == "":
        return prefix
    return check_key(prefix.rstrip("/")) + ("/" if prefix.endswith("/") else "")

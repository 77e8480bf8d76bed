"""Bucket URLs and keys: what parses, and what is refused before any I/O."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotload.errors import ConfigError
from hotload.storage import Scheme, check_key, parse_bucket_url
from hotload.storage.bucket_url import check_prefix


def test_file_url_is_an_absolute_directory() -> None:
    bucket = parse_bucket_url("file:///var/lib/bucket/prefix/")
    assert bucket.scheme is Scheme.FILE
    assert bucket.root_path == Path("/var/lib/bucket/prefix")
    assert str(bucket) == "file:///var/lib/bucket/prefix"


def test_s3_url_splits_bucket_and_prefix() -> None:
    bucket = parse_bucket_url("s3://policies/region-1/run-7/")
    assert (bucket.scheme, bucket.bucket, bucket.prefix) == (
        Scheme.S3,
        "policies",
        "region-1/run-7",
    )
    assert (
        bucket.object_key("step-1/hotload-manifest.json")
        == "region-1/run-7/step-1/hotload-manifest.json"
    )


def test_s3_url_without_prefix_uses_keys_as_they_are() -> None:
    bucket = parse_bucket_url("s3://policies")
    assert bucket.object_key("a/b") == "a/b"
    assert str(bucket) == "s3://policies"


@pytest.mark.parametrize(
    "url",
    [
        "file://relative/path",
        "file:///abs/../escape",
        "s3:///no-bucket",
        "gs://bucket/prefix",
        "s3://bucket/prefix?versionId=1",
        "/just/a/path",
    ],
)
def test_malformed_bucket_urls_are_config_errors(url: str) -> None:
    with pytest.raises(ConfigError):
        parse_bucket_url(url)


@pytest.mark.parametrize(
    "key", ["", "/abs", "a//b", "a/../b", "../a", "a/.", "a/b/", "a\\b", "a\x00b"]
)
def test_unsafe_keys_are_refused(key: str) -> None:
    with pytest.raises(ConfigError):
        check_key(key)


def test_ordinary_keys_pass() -> None:
    assert check_key("step-0001/model-00001.safetensors") == "step-0001/model-00001.safetensors"


def test_prefixes_may_be_empty_or_end_with_a_slash() -> None:
    assert check_prefix("") == ""
    assert check_prefix("step-1/") == "step-1/"
    with pytest.raises(ConfigError):
        check_prefix("../x")

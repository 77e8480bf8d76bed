"""Open a region's bucket the way the trainer's side must reach it, with its credentials.

Credentials come from the publisher's own environment (CONTRACTS.md, "Publisher, buckets,
waiting"): a boto3 profile named after the region's kube context when the shared config or
credentials files have one, else boto3's default chain (environment variables, instance
roles, web identity). Nothing here reads a credential itself or logs one.
"""

from __future__ import annotations

from collections.abc import Callable

import boto3

from hotload.publish.region_client import RegionBucket
from hotload.storage import Storage, open_storage

BucketOpener = Callable[[RegionBucket], Storage]
"""How the publisher opens a region's bucket (the default: :func:`open_region_bucket`)."""


def _available_profiles() -> frozenset[str]:
    # Read each time a bucket is opened (once per region per publisher): the shared files
    # may change while a trainer runs.
    return frozenset(boto3.session.Session().available_profiles)


def profile_for(context: str, available: frozenset[str] | None = None) -> str | None:
    """The boto3 profile for a region: the one named after its context, if there is one."""
    profiles = _available_profiles() if available is None else available
    return context if context in profiles else None


def open_region_bucket(bucket: RegionBucket) -> Storage:
    """A storage for the region's bucket at the endpoint the publisher writes to."""
    if bucket.bucket_url.startswith("file://"):
        return open_storage(bucket.bucket_url)
    return open_storage(
        bucket.bucket_url,
        endpoint=bucket.endpoint,
        region=bucket.region,
        profile=profile_for(bucket.context),
    )

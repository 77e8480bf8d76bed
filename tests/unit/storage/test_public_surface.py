"""The public names of ``hotload.storage``: a rename is a deliberate act."""

from __future__ import annotations

import hotload.storage


def test_public_names_are_pinned() -> None:
    assert sorted(hotload.storage.__all__) == [
        "BucketUrl",
        "DEFAULT_CONCURRENCY",
        "DEFAULT_GET_LIMIT",
        "DEFAULT_PART_SIZE",
        "DownloadResult",
        "NO_RETRY",
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
    for name in hotload.storage.__all__:
        assert hasattr(hotload.storage, name)

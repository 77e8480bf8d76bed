"""The public names of ``hotload.publish``: a rename is a deliberate act."""

from __future__ import annotations

import hotload.publish


def test_public_names_are_pinned() -> None:
    assert sorted(hotload.publish.__all__) == [
        "DEFAULT_FULL_EVERY",
        "NullObserver",
        "PUBLISH_ENDPOINT_ANNOTATION",
        "Phase",
        "PublishHandle",
        "PublishObserver",
        "PublishResult",
        "Publisher",
        "PublisherSettings",
        "RegionBucket",
        "RegionOutcome",
        "RegionResult",
        "identity_for",
    ]
    for name in hotload.publish.__all__:
        assert hasattr(hotload.publish, name)

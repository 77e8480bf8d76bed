"""The trainer's side: publish snapshots to every region, and clean their buckets.

- :class:`Publisher` (with :class:`PublisherSettings`): ``publish(state_dict or
  directory, step)`` encodes a Full or a delta in the trainer's process, uploads it to
  each region's bucket (or the home bucket when buckets replicate), applies the
  PolicySnapshot in every region and optionally waits until it is Ready everywhere;
  :class:`PublishResult` says per region what happened (:class:`RegionResult`,
  :class:`RegionOutcome`).
- :func:`collect_garbage` (``hotload gc``): delete the bucket prefixes no retained
  PolicySnapshot in any region needs.
- :class:`PublishObserver`: progress callbacks (the CLI's rich display is one).
"""

from hotload.api.labels import PUBLISH_ENDPOINT_ANNOTATION
from hotload.publish.cadence import DEFAULT_FULL_EVERY, identity_for
from hotload.publish.observer import NullObserver, Phase, PublishObserver
from hotload.publish.publisher import Publisher, PublisherSettings, PublishHandle
from hotload.publish.region_client import RegionBucket
from hotload.publish.results import PublishResult, RegionOutcome, RegionResult

__all__ = [
    "DEFAULT_FULL_EVERY",
    "PUBLISH_ENDPOINT_ANNOTATION",
    "NullObserver",
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

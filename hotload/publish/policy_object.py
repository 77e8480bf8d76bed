"""The PolicySnapshot object the publisher applies in every region for one snapshot."""

from __future__ import annotations

from hotload.api import PolicySnapshot, SnapshotKind
from hotload.publish.settings import PublisherSettings
from hotload.snapshot import FORMAT


def policy_snapshot(
    settings: PublisherSettings,
    identity: str,
    step: int,
    kind: SnapshotKind,
    previous: str | None,
    compression_format: str = FORMAT,
    digest: str | None = None,
    checkpoint: tuple[str, str] | None = None,
) -> dict[str, object]:
    """Its ``to_k8s()`` form, validated by the API's model; ``compression_format`` is the
    format the snapshot was written in (v4 when its tensors are stored as parts), ``digest``
    the rebuilt weights' tensor-set digest (``manifest_digest``): the operator counts a
    replica toward Ready at once when its report carries it. ``checkpoint``: the
    (identity, of) a delta's manifest names, copied into ``incremental.checkpoint`` for
    the operator's retention."""
    spec: dict[str, object] = {
        "deploymentRef": {"name": settings.deployment},
        "identity": identity,
        "step": step,
        "kind": kind.value,
    }
    if digest is not None:
        spec["digest"] = digest
    if previous is not None:
        # the format the encoder just wrote, not the API's historical default (v1)
        incremental: dict[str, object] = {
            "previousIdentity": previous,
            "compressionFormat": compression_format,
        }
        if checkpoint is not None:
            incremental["checkpoint"] = {"identity": checkpoint[0], "of": checkpoint[1]}
        spec["incremental"] = incremental
    if settings.kv_cache_policy is not None:
        spec["kvCachePolicy"] = settings.kv_cache_policy.value
    if settings.ignored_config_fields:
        spec["ignoredConfigFields"] = list(settings.ignored_config_fields)
    snapshot = PolicySnapshot.model_validate(
        {"metadata": {"name": identity, "namespace": settings.namespace}, "spec": spec}
    )
    return snapshot.to_k8s()

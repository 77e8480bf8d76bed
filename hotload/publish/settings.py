"""What a publisher is told once: :class:`PublisherSettings`, checked when made."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hotload.api import KvCachePolicy
from hotload.errors import ConfigError
from hotload.publish.cadence import DEFAULT_FULL_EVERY, check_prefix
from hotload.snapshot.publish import DEFAULT_UPLOAD_CONCURRENCY


@dataclass(frozen=True)
class PublisherSettings:
    """Everything a publisher needs to know once."""

    deployment: str
    """The RolloutDeployment (same name in every region) the snapshots are for."""
    contexts: tuple[str, ...]
    """One kube context per region."""
    workdir: Path
    """The publisher's own directory (state, previous weights, encoded snapshots)."""
    namespace: str = "default"
    kubeconfig: Path | None = None
    """None: in-cluster credentials."""
    identity_prefix: str | None = None
    """Identities are ``<prefix>-step-<n>`` (deltas) and ``…-full``; default: the deployment."""
    full_every: int = DEFAULT_FULL_EVERY
    checkpoints: bool = True
    """Every ``full_every`` steps, publish the step as a delta and a Full of its weights
    *beside* the chain (a checkpoint, format v5: upgrade the sidecars first), instead of a
    Full in the chain that every delta after it waits behind. A sharded publisher always
    publishes its cadence's Full in the chain."""
    home: str | None = None
    """With bucket replication: the one context whose bucket is written."""
    wait: bool = False
    wait_timeout_s: float = 600.0
    replication_timeout_s: float = 60.0
    """With ``home``: how long a region's PolicySnapshot waits for replication to bring
    the region its copy (checked through the region's publish endpoint) before it is
    applied anyway (its replicas then retry until the files arrive)."""
    replication_nudge_after_s: float = 15.0
    """With ``home``: files still missing in a region's bucket after this long are written
    into the home bucket again (from the encoded snapshot), so replication sends them anew.
    MinIO parks an object whose replication failed (a target it saw offline for a moment)
    for one to several minutes; a new version replicates at once. 0: never."""
    fallback_full: bool = True
    """With ``wait``: when a region reports the chain broken, publish a Full of the same
    weights at once. Off: the next publish is a Full (the cadence's ``chain-broken`` rule)."""
    unreachable_after_s: float = 15.0
    encode_threads: int = 4
    upload_concurrency: int = DEFAULT_UPLOAD_CONCURRENCY
    max_pending: int = 1
    """Publishes that may wait behind the running one; a newer publish replaces the oldest
    waiting one rather than blocking the trainer (:mod:`hotload.publish.newest`)."""
    files_from: Path | None = None
    """Non-tensor files (config.json, tokenizer) that go with a state_dict."""
    dtype: str | None = None
    """Convert a state_dict's tensors to this dtype (e.g. ``bfloat16``) when copying them."""
    kv_cache_policy: KvCachePolicy | None = None
    ignored_config_fields: tuple[str, ...] = ()
    endpoints: Mapping[str, str] = field(default_factory=dict)
    """Context → the endpoint the publisher writes that region's bucket at (overrides
    the RolloutDeployment's)."""
    rank_timeout_s: float = 60.0
    """Sharded publish: a rank whose heartbeat stops for this long fails the round."""

    def __post_init__(self) -> None:
        if not self.contexts:
            raise ConfigError("give at least one kube context (one per region)")
        if len(set(self.contexts)) != len(self.contexts):
            raise ConfigError("kube contexts must be unique", contexts=list(self.contexts))
        if self.home is not None and self.home not in self.contexts:
            raise ConfigError(
                "the home context must be one of the contexts",
                home=self.home,
                contexts=list(self.contexts),
            )
        unknown = sorted(set(self.endpoints) - set(self.contexts))
        if unknown:
            raise ConfigError("endpoints given for unknown contexts", contexts=unknown)
        if self.max_pending < 1 or self.encode_threads < 1 or self.upload_concurrency < 1:
            raise ConfigError("max_pending, encode_threads and upload_concurrency are >= 1")
        if self.wait_timeout_s <= 0 or self.rank_timeout_s <= 0:
            raise ConfigError(
                "timeouts must be positive",
                wait_timeout_s=self.wait_timeout_s,
                rank_timeout_s=self.rank_timeout_s,
            )
        check_prefix(self.prefix)

    @property
    def prefix(self) -> str:
        return self.identity_prefix or self.deployment

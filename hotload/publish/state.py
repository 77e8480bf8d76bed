"""The publisher's memory, kept in its work directory so that a restarted trainer (or the
next ``hotload publish`` of a directory) goes on where the last one stopped: the last
snapshot (the base of the next delta, its weights kept beside), the current chain since
its Full, and, per region, the snapshots not applied there yet (a region that was down).

Written atomically (temporary file, fsync, rename) after every publish. One publisher
per work directory: a lock file says so.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO, Final

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from hotload.api import SnapshotKind
from hotload.errors import ConfigError
from hotload.publish.cadence import Previous

STATE_FILE: Final = "state.json"
LOCK_FILE: Final = ".lock"
WEIGHTS_DIR: Final = "weights"
ENCODED_DIR: Final = "encoded"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LastSnapshot(_Model):
    identity: str
    step: int
    kind: SnapshotKind
    last_full_step: int
    weights: str
    """Its weights directory (under the work directory): the base of the next delta."""

    def previous(self) -> Previous:
        return Previous(self.identity, self.step, self.kind, self.last_full_step)


class CheckpointRecord(_Model):
    """A checkpoint: a Full of one chain snapshot's weights, published beside the chain."""

    identity: str
    """The Full's identity (``<prefix>-step-<n>-checkpoint``); it has no PolicySnapshot."""
    of: str
    """The chain's snapshot whose weights it holds."""
    step: int
    weights: str
    """The weights directory it is encoded from: kept until it is complete everywhere."""


class PendingSnapshot(_Model):
    """A snapshot one region has not got yet, in publish order."""

    identity: str
    policy_snapshot: dict[str, object] = Field(
        validation_alias=AliasChoices("policy_snapshot", "manifest")
    )
    """The PolicySnapshot to apply (its ``to_k8s()`` form). Read from ``manifest`` too: the
    name earlier versions gave it in state.json."""
    encoded: str
    """Its encoded directory, kept until every region has it."""
    uploaded: bool = False
    """Already in the bucket this region reads (or the home bucket, with replication)."""
    rank_buckets: list[tuple[str, str | None]] | None = None
    """A sharded snapshot: the buckets (url, endpoint) its ranks wrote their files to;
    only those can receive it (the encoded directory holds the coordinator's files only)."""


class PendingSwitch(_Model):
    """A coordinated switch decision one region has not got yet (it did not answer)."""

    identity: str
    annotation: str
    """``hotload.dev/switch-at`` (a commit) or ``hotload.dev/switch-aborted``."""
    value: str
    """RFC 3339 UTC with milliseconds."""


class PublisherState(_Model):
    deployment: str
    namespace: str
    last: LastSnapshot | None = None
    chain: list[str] = Field(default_factory=list)
    """Identities since (and including) the newest Full."""
    pending: dict[str, list[PendingSnapshot]] = Field(default_factory=dict)
    """Kube context → snapshots still to apply there, oldest first."""
    switches: dict[str, list[PendingSwitch]] = Field(default_factory=dict)
    """Kube context → coordinated switch decisions still to write there, oldest first."""
    checkpoint: CheckpointRecord | None = None
    """The newest checkpoint complete in every region's bucket: each later delta of its
    chain names it (none once the chain restarts from a Full)."""
    checkpoint_pending: CheckpointRecord | None = None
    """The checkpoint being published beside the chain (resumed after a restart)."""

    def named_checkpoint(self) -> CheckpointRecord | None:
        """The checkpoint the next delta names: the complete one, while its snapshot is
        still in the current chain."""
        checkpoint = self.checkpoint
        return checkpoint if checkpoint is not None and checkpoint.of in self.chain else None

    def referenced_encoded(self) -> set[str]:
        return {item.encoded for items in self.pending.values() for item in items}


class WorkDir:
    """The publisher's directory: state.json, weights/<identity>/, encoded/<identity>/."""

    def __init__(self, root: Path) -> None:
        self.root = root.expanduser().absolute()
        self._lock: IO[str] | None = None

    @property
    def state_file(self) -> Path:
        return self.root / STATE_FILE

    def weights(self, identity: str) -> Path:
        return self.root / WEIGHTS_DIR / identity

    def encoded(self, identity: str) -> Path:
        return self.root / ENCODED_DIR / identity

    def lock(self) -> None:
        """Hold the directory for this process; a second publisher on it is refused."""
        self.root.mkdir(parents=True, exist_ok=True)
        handle = (self.root / LOCK_FILE).open("a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as err:
            handle.close()
            raise ConfigError(
                "another publisher is using this work directory", workdir=str(self.root)
            ) from err
        self._lock = handle

    def unlock(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def load(self, deployment: str, namespace: str) -> PublisherState:
        """The saved state, or a fresh one; a state of another deployment is refused."""
        try:
            state = PublisherState.model_validate_json(self.state_file.read_text())
        except FileNotFoundError:
            return PublisherState(deployment=deployment, namespace=namespace)
        except (OSError, ValidationError) as err:
            raise ConfigError(
                "the publisher's state file is unreadable; move the work directory aside",
                path=str(self.state_file),
                error=str(err)[:300],
            ) from err
        if (state.deployment, state.namespace) != (deployment, namespace):
            raise ConfigError(
                "this work directory belongs to another deployment",
                workdir=str(self.root),
                holds=f"{state.namespace}/{state.deployment}",
                wanted=f"{namespace}/{deployment}",
            )
        if state.last is not None and not Path(state.last.weights).is_dir():
            # Its weights are gone: the next snapshot cannot be a delta against it.
            state = state.model_copy(update={"last": None, "chain": []})
        pending = state.checkpoint_pending
        if pending is not None and not Path(pending.weights).is_dir():
            # Nothing left to encode it from: the cadence begins another.
            state = state.model_copy(update={"checkpoint_pending": None})
        return state

    def save(self, state: PublisherState) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_name(f".{STATE_FILE}.tmp")
        with tmp.open("w") as handle:
            handle.write(state.model_dump_json(indent=2))
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(self.state_file)

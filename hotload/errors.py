"""One error hierarchy for all of hotload.

A leaf module: every layer (``api`` included) may import it and it imports nothing
of ours. Each invariant gets its own class carrying its context as attributes, so
callers branch on the class, never on message text. Foreign exceptions (botocore,
kubernetes ``ApiException``, httpx) are mapped to these at the storage, kube and
engine boundaries with ``raise Ours(...) from err``.

Every class has a ``reason``: the CamelCase word that the sidecar writes on its pod
and the operator puts on conditions and Events (the constants live in
``hotload.api.reasons``; they are spelled the same here so this module stays a leaf).
``transient`` says whether retrying with backoff may succeed.
"""

from __future__ import annotations

import errno
from typing import Any, ClassVar


class HotloadError(Exception):
    """Root of every error hotload raises on purpose."""

    reason: ClassVar[str] = "Error"
    transient: ClassVar[bool] = False

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.context: dict[str, Any] = context

    def __str__(self) -> str:
        if not self.context:
            return self.message
        details = ", ".join(f"{key}={value!r}" for key, value in sorted(self.context.items()))
        return f"{self.message} ({details})"


# --- configuration and usage -------------------------------------------------------


class ConfigError(HotloadError):
    """A setting, flag or environment variable is missing or malformed."""

    reason = "ConfigInvalid"


class ApiValidationError(HotloadError):
    """An object does not satisfy hotload's API rules (checked client-side too)."""

    reason = "Invalid"

    def __init__(self, message: str, *, field: str, **context: Any) -> None:
        super().__init__(message, field=field, **context)
        self.field = field


# --- snapshots and chains (breaks: the chain cannot be used) ----------------------


class SnapshotError(HotloadError):
    """Something is wrong with a snapshot's files or manifest."""

    reason = "ManifestInvalid"


class ManifestInvalid(SnapshotError):
    """The manifest is malformed, over its limits, or disagrees with the files."""

    reason = "ManifestInvalid"


class TargetInconsistent(HotloadError):
    """The deployment's target disagrees with the snapshot's own manifest (its step or kind):
    a fault of whoever wrote the target, not of the snapshot, so never a chain break. The
    replica waits for the target to change (the operator repairs it)."""

    reason = "TargetInconsistent"


class ChecksumMismatch(SnapshotError):
    """Stored bytes or a rebuilt tensor hash differently than the manifest says."""

    reason = "ChecksumMismatch"


class ChainBroken(SnapshotError):
    """A delta's previous snapshot is missing, wrong, or the chain has a cycle."""

    reason = "ChainBroken"


class DecodeFailed(SnapshotError):
    """A delta could not be decoded (bad codec data, size bomb, dtype mismatch)."""

    reason = "DecodeFailed"


class UnsafePath(ManifestInvalid):
    """A file name in a manifest or header could escape its directory (``..``, ``/x``)."""


class SizeLimitExceeded(DecodeFailed):
    """Data would grow past a size declared in the manifest or a format limit (a bomb)."""


# --- storage (transient unless stated) ----------------------------------------------


class StorageError(HotloadError):
    """Object storage could not serve a request."""

    reason = "StorageUnavailable"
    transient = True


class StorageUnavailable(StorageError):
    """The bucket did not answer, or answered with a server error: retry with backoff."""


class NotFound(StorageError):
    """An object is not there (yet): replication may deliver files out of order."""

    reason = "NotFound"


class AccessDenied(StorageError):
    """The bucket refused our credentials: retrying will not help."""

    reason = "AccessDenied"
    transient = False


class ObjectTooLarge(StorageError):
    """An object read whole is over the caller's cap (checked before it is read)."""

    reason = "ObjectTooLarge"
    transient = False


class StorageRejected(StorageError):
    """The store refused a request for another reason than access (malformed, unsupported)."""

    reason = "StorageRejected"
    transient = False


# --- resources of this host (transient: retried once there is room again) -----------


class ResourceExhausted(HotloadError):
    """This process ran out of a resource of its host: retry once there is room again."""

    transient = True


class DiskFull(ResourceExhausted):
    """A volume we write (the staging ``emptyDir``: tmpfs when its medium is Memory) has no
    space left (``ENOSPC``, ``EDQUOT``, ``EFBIG``). The write's partial files are removed."""

    reason = "DiskFull"


class OutOfMemory(ResourceExhausted):
    """An allocation failed (``MemoryError``, ``ENOMEM``): memory pressure on the pod."""

    reason = "OutOfMemory"


#: The errnos that mean "no space left where we write".
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def resource_exhausted(error: BaseException, **context: Any) -> ResourceExhausted | None:
    """The typed error for a foreign one that means the host ran out of space or memory
    (``OSError`` with a no-space errno, ``MemoryError``, ``ENOMEM``); None otherwise.
    ``context`` says where (the path written, the phase)."""
    if isinstance(error, ResourceExhausted):
        return error
    if isinstance(error, MemoryError):
        return OutOfMemory("out of memory", error=str(error) or "MemoryError", **context)
    if isinstance(error, OSError):
        if error.errno in NO_SPACE_ERRNOS:
            return DiskFull("no space left on the volume", error=str(error), **context)
        if error.errno == errno.ENOMEM:
            return OutOfMemory("out of memory", error=str(error), **context)
    return None


# --- engines ------------------------------------------------------------------------


class EngineError(HotloadError):
    """The inference engine could not do what was asked."""

    reason = "EngineError"


class EngineBusy(EngineError):
    """The engine is busy (paused, another swap running): retry shortly."""

    reason = "EngineBusy"
    transient = True


class EngineRejected(EngineError):
    """The engine refused the weights: this replica is Failed, the chain is not."""

    reason = "EngineRejected"


class LoadNotStarted(EngineRejected):
    """Refused before the engine was asked (the adapter's checks of the directory): the
    engine's weights were never touched, whatever its ``rollback_trusted`` says."""


class DeltaNotApplicable(EngineRejected):
    """The engine cannot patch this delta into its live weights (the layout changed, or
    it serves a LoRA merge); its old weights serve on: load the rebuilt directory."""


class EngineUnavailable(EngineError):
    """The engine does not answer at its address."""

    reason = "EngineUnavailable"
    transient = True


class DigestMismatch(EngineError):
    """After a swap the engine's digest of its weights is not the verified snapshot's:
    the engine serves something else than it was handed."""

    reason = "DigestMismatch"


# --- Kubernetes ---------------------------------------------------------------------


class KubeError(HotloadError):
    """A Kubernetes API call failed."""

    reason = "KubeError"
    transient = True

    def __init__(self, message: str, *, status: int | None = None, **context: Any) -> None:
        super().__init__(message, status=status, **context)
        self.status = status


class KubeForbidden(KubeError):
    """RBAC (or an admission policy) refused the call."""

    reason = "Forbidden"
    transient = False


class KubeNotFound(KubeError):
    """The object does not exist."""

    reason = "NotFound"
    transient = False


class KubeConflict(KubeError):
    """A write lost a race (resourceVersion conflict): re-read and retry."""

    reason = "Conflict"


class KubeExpired(KubeError):
    """A watch's resourceVersion is too old (410 Gone): list again, then watch from there."""

    reason = "Expired"


class NotLeader(HotloadError):
    """This operator does not hold its region's leader Lease (now, or any more): it must
    not write a decision. Raised before a write is sent, or when the apiserver's fencing
    policy refused a write whose fence is no longer the Lease's."""

    reason = "NotLeader"
    transient = True


# --- the trainer's publisher --------------------------------------------------------


class PublishError(HotloadError):
    """A snapshot could not be published (encoded, uploaded or applied)."""

    reason = "PublishFailed"


class PublishConflict(PublishError):
    """A PolicySnapshot of that identity with another spec already exists in a region:
    an identity names one snapshot forever."""

    reason = "SnapshotConflict"


class RankFailed(PublishError):
    """A sharded publish did not commit: one rank of the trainer failed, stopped answering
    or disagreed (``rank``, ``step`` in the context). Every rank raises it alike; no
    manifest was written, and the next publish goes on from the last committed one."""

    reason = "RankFailed"


class GcRefused(PublishError):
    """``hotload gc`` cannot know what every region still needs (a region did not
    answer), so it deletes nothing."""

    reason = "GcRefused"


# --- local regions ------------------------------------------------------------------


class LocalRegionError(HotloadError):
    """The local control plane could not be started, reached or stopped."""

    reason = "LocalRegionFailed"


class ToolMissing(LocalRegionError):
    """A pinned binary is not in the cache: run hack/build-tools."""

    reason = "ToolMissing"


class RegionIndexTaken(LocalRegionError):
    """Another live set of local regions holds this address index: pick another base."""

    reason = "RegionIndexTaken"


class ChartInstallFailed(LocalRegionError):
    """helm could not install (or remove) the chart in a region, or the operator it runs
    did not become available there."""

    reason = "ChartInstallFailed"


class ContainerConfigInvalid(LocalRegionError):
    """The local pod runtime cannot build a container's world (a missing Secret or
    ConfigMap key, an unsupported field or volume): the container waits with this reason
    and the runtime retries with backoff, as a kubelet does."""

    reason = "CreateContainerConfigError"


class ImageNotInstalled(ContainerConfigInvalid):
    """A local image's virtualenv is not in the cache (hack/install-vllm did not run or
    was refused): the container waits, as a kubelet waits on an image it may not pull."""

    reason = "ErrImageNeverPull"

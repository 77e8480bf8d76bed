"""Every reason the sidecar writes is a constant of ``hotload.api.reasons`` with its class,
and the error classes that carry it agree on whether it is transient."""

from __future__ import annotations

import pytest

from hotload import errors
from hotload.api import reasons
from hotload.api.reasons import ReasonClass, reason_class

#: Errors a load can end with (what the sidecar may write as ``hotload.dev/reason``).
LOAD_ERRORS: tuple[type[errors.HotloadError], ...] = (
    errors.ChecksumMismatch,
    errors.ChainBroken,
    errors.ManifestInvalid,
    errors.UnsafePath,
    errors.DecodeFailed,
    errors.SizeLimitExceeded,
    errors.StorageUnavailable,
    errors.NotFound,
    errors.AccessDenied,
    errors.StorageRejected,
    errors.EngineBusy,
    errors.EngineUnavailable,
    errors.EngineRejected,
    errors.EngineError,
    errors.DigestMismatch,
    errors.ConfigError,
    errors.DiskFull,
    errors.OutOfMemory,
)


@pytest.mark.parametrize("error", LOAD_ERRORS, ids=lambda e: e.__name__)
def test_every_load_error_reason_is_a_classified_constant(error: type[errors.HotloadError]) -> None:
    assert error.reason in reasons.REASON_CLASSES, f"{error.reason} has no class"
    transient = reason_class(error.reason) is ReasonClass.TRANSIENT
    assert transient == error.transient, f"{error.__name__}: class and error disagree"


def test_engine_unavailable_is_transient_and_internal_error_is_replica_only() -> None:
    assert reasons.ENGINE_UNAVAILABLE in reasons.TRANSIENT_REASONS
    assert reason_class(reasons.INTERNAL_ERROR) is ReasonClass.REPLICA


def test_the_three_classes_do_not_overlap() -> None:
    sets = (reasons.CHAIN_BREAKING_REASONS, reasons.TRANSIENT_REASONS, reasons.REPLICA_REASONS)
    assert sum(len(s) for s in sets) == len(set().union(*sets)) == len(reasons.REASON_CLASSES)


def test_an_unknown_word_concerns_only_its_replica() -> None:
    assert reason_class("SomethingNew") is ReasonClass.REPLICA


def test_a_target_inconsistent_with_its_manifest_is_not_a_chain_break() -> None:
    # CONTRACTS.md, "Target faults are not snapshot faults": only the snapshot's own bytes
    # and chain can mark ChainValid=False.
    assert reasons.TARGET_INCONSISTENT not in reasons.CHAIN_BREAKING_REASONS
    assert reason_class(reasons.TARGET_INCONSISTENT) is ReasonClass.REPLICA


def test_running_out_of_space_or_memory_is_its_own_transient_reason() -> None:
    # Issue 22, finding 8: ENOSPC in fetch or rebuild was an untyped InternalError, and the
    # replica stayed Failed after space returned.
    import errno

    assert reason_class(reasons.DISK_FULL) is ReasonClass.TRANSIENT
    assert reason_class(reasons.OUT_OF_MEMORY) is ReasonClass.TRANSIENT
    for number in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        mapped = errors.resource_exhausted(OSError(number, "full"), path="/x")
        assert isinstance(mapped, errors.DiskFull) and mapped.context["path"] == "/x"
    assert isinstance(errors.resource_exhausted(MemoryError()), errors.OutOfMemory)
    assert isinstance(errors.resource_exhausted(OSError(errno.ENOMEM, "")), errors.OutOfMemory)
    assert errors.resource_exhausted(OSError(errno.EIO, "io")) is None
    assert errors.resource_exhausted(ValueError("x")) is None

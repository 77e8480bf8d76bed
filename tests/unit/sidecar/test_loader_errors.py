"""Parallel downloads that fail report one typed error: the one that matters most."""

from __future__ import annotations

from hotload.errors import ChecksumMismatch, NotFound, StorageUnavailable
from hotload.sidecar.loader import _first_error


def test_a_chain_breaking_error_wins_over_transient_ones() -> None:
    group = ExceptionGroup(
        "downloads", [NotFound("late"), ExceptionGroup("inner", [ChecksumMismatch("bad")])]
    )
    assert isinstance(_first_error(group), ChecksumMismatch)


def test_a_typed_error_wins_over_an_untyped_one() -> None:
    group = ExceptionGroup("downloads", [ValueError("bug"), StorageUnavailable("down")])
    assert isinstance(_first_error(group), StorageUnavailable)

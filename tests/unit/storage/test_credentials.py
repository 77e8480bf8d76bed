"""Credentials never show themselves, whatever prints them."""

from __future__ import annotations

from hotload.storage import StorageCredentials


def test_repr_and_str_hide_every_field() -> None:
    credentials = StorageCredentials(
        "AKIDVISIBLE123", "supersecretvalue", session_token="tok-abc-123"
    )
    for text in (repr(credentials), str(credentials), f"{credentials}", repr([credentials])):
        assert "AKIDVISIBLE123" not in text
        assert "supersecretvalue" not in text
        assert "tok-abc-123" not in text
        assert "redacted" in text


def test_credentials_compare_by_value() -> None:
    assert StorageCredentials("a", "b") == StorageCredentials("a", "b")
    assert StorageCredentials("a", "b") != StorageCredentials("a", "c")

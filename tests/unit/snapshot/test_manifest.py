"""The manifest schema: what parses, what is refused, and what a reader may fetch."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hotload.errors import ManifestInvalid, SizeLimitExceeded, UnsafePath
from hotload.snapshot import FORMAT, MANIFEST_NAME, Manifest, parse_manifest
from hotload.snapshot.paths import safe_relpath

from .conftest import Chain


def document(chain: Chain) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((chain.snapshot / MANIFEST_NAME).read_bytes())
    return result


def reparse(doc: dict[str, Any]) -> Manifest:
    return parse_manifest(json.dumps(doc).encode())


def test_manifest_round_trips_through_its_bytes(chain: Chain) -> None:
    manifest = chain.delta.manifest
    assert parse_manifest(manifest.dumps()) == manifest
    assert manifest.format == FORMAT == "hotload-delta/v1"
    raw = document(chain)
    assert raw["kind"] == "Incremental" and raw["previous"] == "s1"
    assert raw["fileHash"] == "sha256" and raw["tensorHash"] == "xxh3-128"


def test_files_to_fetch_lists_stored_files_only(chain: Chain) -> None:
    manifest = chain.delta.manifest
    assert manifest.files_to_fetch() == [d.path for d in manifest.deltas]
    assert "tokenizer.json" not in manifest.files_to_fetch()  # referenced, not stored


def test_expected_identity_must_match(chain: Chain) -> None:
    with pytest.raises(ManifestInvalid, match="another snapshot"):
        parse_manifest(chain.delta.manifest.dumps(), expected_identity="s3")


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        (lambda d: d.update(kind="Delta"), ManifestInvalid),
        (lambda d: d.pop("previous"), ManifestInvalid),
        (lambda d: d.update(identity="Has/Slash"), ManifestInvalid),
        (lambda d: d.update(step=-1), ManifestInvalid),
        (lambda d: d.update(fileHash="md5"), ManifestInvalid),
        (lambda d: d.update(tensorHash="crc32"), ManifestInvalid),
        (lambda d: d.update(surprise=True), ManifestInvalid),
        (lambda d: d["tensors"].append(dict(d["tensors"][0])), ManifestInvalid),
        (lambda d: d["tensors"][0].update(file="other.safetensors"), ManifestInvalid),
        (lambda d: d["tensors"][0].update(dtype="Q4_K"), ManifestInvalid),
        (lambda d: d["tensors"][0].update(shape=[1 << 62, 1 << 62]), ManifestInvalid),
        (lambda d: d["deltas"][0].update(hash="xyz"), ManifestInvalid),
        (lambda d: d["deltas"].append(dict(d["deltas"][0])), ManifestInvalid),
        (lambda d: d["deltas"][0].update(path="../../x"), UnsafePath),
        (lambda d: d["referenced"][0].update(path="/abs"), UnsafePath),
        (lambda d: d["shards"][0].update(path="a/./b"), UnsafePath),
    ],
)
def test_malformed_manifests_are_refused(chain: Chain, edit: Any, error: type[Exception]) -> None:
    doc = document(chain)
    edit(doc)
    with pytest.raises(error):
        reparse(doc)


def test_data_range_past_its_delta_file_is_refused(chain: Chain) -> None:
    doc = document(chain)
    entry = next(t for t in doc["tensors"] if "data" in t)
    entry["data"]["offset"] = doc["deltas"][0]["size"]
    with pytest.raises(ManifestInvalid):
        reparse(doc)


def test_a_file_named_like_the_manifest_is_refused(chain: Chain) -> None:
    doc = document(chain)
    doc["referenced"][0]["path"] = MANIFEST_NAME
    with pytest.raises(ManifestInvalid):
        reparse(doc)


def test_adler32_is_accepted_on_input(chain: Chain) -> None:
    doc = document(chain)
    doc["fileHash"] = "adler32"
    for key in ("deltas", "referenced"):
        for entry in doc[key]:
            entry["hash"] = "0a0b0c0d"
    assert reparse(doc).file_hash.value == "adler32"


@pytest.mark.parametrize("data", [b"", b"\xff\xfe", b"[]", b'{"format": 1}', b"{" * 100_000])
def test_garbage_is_manifest_invalid(data: bytes) -> None:
    with pytest.raises(ManifestInvalid):
        parse_manifest(data)


def test_oversized_manifest_is_refused_before_parsing() -> None:
    with pytest.raises(SizeLimitExceeded):
        parse_manifest(b" " * (64 * 1024 * 1024 + 1))


@pytest.mark.parametrize("path", ["config.json", "1_Pooling/config.json", "a b/c-d_e.json"])
def test_safe_paths_pass(path: str) -> None:
    assert safe_relpath(path) == path


@pytest.mark.parametrize(
    "path", ["", "/x", "..", "../x", "x/..", "x//y", "x/", "./x", "a\\b", "c:x", "x\ny", "a" * 1025]
)
def test_unsafe_paths_fail(path: str) -> None:
    with pytest.raises(UnsafePath):
        safe_relpath(path)

"""The manifest schema: what parses, what is refused, and what a reader may fetch."""

from __future__ import annotations

import json
from typing import Any

import pytest
import zstandard

from hotload.errors import ManifestInvalid, SizeLimitExceeded, UnsafePath
from hotload.snapshot import FORMAT, MANIFEST_NAME, Manifest, parse_manifest
from hotload.snapshot.manifest_codec import FORMAT_V1, ZSTD_MAGIC, dump_document, load_document
from hotload.snapshot.paths import safe_relpath

from .conftest import Chain


def document(chain: Chain) -> dict[str, Any]:
    """The stored manifest as a document, tensors as a list of objects."""
    return load_document((chain.snapshot / MANIFEST_NAME).read_bytes())


def reparse(doc: dict[str, Any]) -> Manifest:
    return parse_manifest(json.dumps(doc).encode())


def test_manifest_round_trips_through_its_bytes(chain: Chain) -> None:
    manifest = chain.delta.manifest
    assert parse_manifest(manifest.dumps()) == manifest
    assert manifest.format == FORMAT == "hotload-delta/v2"
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


# --- v2: the compact form ------------------------------------------------------------


def stored_document(chain: Chain) -> dict[str, Any]:
    """The stored v2 manifest as written: columns, before they are expanded."""
    data = (chain.snapshot / MANIFEST_NAME).read_bytes()
    assert data[:4] == ZSTD_MAGIC
    result: dict[str, Any] = json.loads(zstandard.ZstdDecompressor().decompress(data))
    return result


def recompress(doc: dict[str, Any], *, content_size: bool = True) -> bytes:
    text = json.dumps(doc).encode()
    return bytes(zstandard.ZstdCompressor(write_content_size=content_size).compress(text))


def test_v2_manifest_is_compressed_columns_and_much_smaller_than_v1(chain: Chain) -> None:
    manifest = chain.delta.manifest
    compact = manifest.dumps()
    as_v1 = dump_document(
        {**manifest.model_dump(mode="json", by_alias=True, exclude_none=True), "format": FORMAT_V1}
    )
    assert compact[:4] == ZSTD_MAGIC and as_v1[:1] == b"{"
    assert len(compact) < len(as_v1) / 2
    columns = stored_document(chain)["tensors"]
    assert columns["name"] == [t.name for t in manifest.tensors]
    assert columns["hash"] == "".join(t.hash for t in manifest.tensors)


@pytest.mark.parametrize(
    "edit",
    [
        lambda c: c["name"].append("extra"),  # columns of different lengths
        lambda c: c.update(hash=c["hash"][:-1]),  # hashes do not match the count
        lambda c: c["file"].__setitem__(0, 5),  # no such shard
        lambda c: c["file"].__setitem__(0, "model.safetensors"),  # a name, not an index
        lambda c: c["data"].__setitem__(1, [9, 0, 1]),  # no such delta file
        lambda c: c["data"].__setitem__(1, [0, -1, 1]),  # negative skip
        lambda c: c["data"].__setitem__(1, [0, 1]),  # not a triple
        lambda c: c.pop("changed"),  # a column missing
        lambda c: c.update(surprise=[]),  # an unknown column
    ],
)
def test_malformed_v2_columns_are_manifest_invalid(chain: Chain, edit: Any) -> None:
    doc = stored_document(chain)
    edit(doc["tensors"])
    with pytest.raises(ManifestInvalid):
        parse_manifest(recompress(doc))


def test_v2_payload_offsets_are_skips_since_the_previous_payload(chain: Chain) -> None:
    ranges = [t.data for t in chain.delta.manifest.tensors if t.data is not None]
    skips = [d[1] for d in stored_document(chain)["tensors"]["data"] if d is not None]
    assert skips[1:] == [0] * (len(ranges) - 1)  # laid out back to back
    assert [r.offset for r in ranges] == sorted(r.offset for r in ranges)


def test_v2_manifest_frames_are_bounded(chain: Chain) -> None:
    doc = stored_document(chain)
    with pytest.raises(SizeLimitExceeded):  # no declared size: could be anything
        parse_manifest(recompress(doc, content_size=False))
    with pytest.raises(ManifestInvalid):  # trailing bytes after the frame
        parse_manifest(recompress(doc) + b"\0")
    with pytest.raises(ManifestInvalid):  # corrupt frame
        frame = bytearray(recompress(doc))
        frame[len(frame) // 2] ^= 0xFF
        parse_manifest(bytes(frame))


def test_v2_accepts_tensors_as_objects_and_v1_refuses_the_context_codec(chain: Chain) -> None:
    doc = document(chain)
    assert parse_manifest(json.dumps(doc).encode()) == chain.delta.manifest
    doc["format"] = FORMAT_V1
    if any(t["codec"] == "context" for t in doc["tensors"]):
        with pytest.raises(ManifestInvalid):
            reparse(doc)
    for tensor in doc["tensors"]:
        tensor["codec"] = "context" if "data" in tensor else tensor["codec"]
    with pytest.raises(ManifestInvalid):
        reparse(doc)

"""The manifest schema: what parses, what is refused, and what a reader may fetch."""

from __future__ import annotations

import json
from typing import Any

import pytest
import zstandard

from hotload.api.formats import FORMAT_V1, FORMAT_V2
from hotload.errors import ManifestInvalid, SizeLimitExceeded, UnsafePath
from hotload.snapshot import FORMAT, MANIFEST_NAME, Manifest, parse_manifest
from hotload.snapshot.manifest_codec import ZSTD_MAGIC, dump_document, load_document
from hotload.snapshot.manifest_table import MAGIC
from hotload.snapshot.paths import safe_relpath

from . import tampering
from .conftest import Chain


def document(chain: Chain) -> dict[str, Any]:
    """The stored manifest as a document, tensors as a list of objects."""
    return load_document((chain.snapshot / MANIFEST_NAME).read_bytes())


def reparse(doc: dict[str, Any]) -> Manifest:
    return parse_manifest(json.dumps(doc).encode())


def test_manifest_round_trips_through_its_bytes(chain: Chain) -> None:
    manifest = chain.delta.manifest
    assert parse_manifest(manifest.dumps()) == manifest
    assert manifest.format == FORMAT == "hotload-delta/v3"
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


def test_adler32_is_accepted_on_input_before_v3(chain: Chain) -> None:
    doc = document(chain)
    doc["fileHash"] = "adler32"
    with pytest.raises(ManifestInvalid, match="sha256"):
        reparse(doc)  # v3 stores sha256 only
    doc = tampering.as_v2(doc, chain.rebuilt_v1)
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


# --- v2: the compact form (read only) ----------------------------------------------


def v2_bytes(chain: Chain) -> bytes:
    """The chain's delta manifest as the v2 writer stored it."""
    return dump_document(tampering.as_v2(document(chain), chain.rebuilt_v1))


def stored_document(chain: Chain) -> dict[str, Any]:
    """The stored v2 manifest as written: columns, before they are expanded."""
    data = v2_bytes(chain)
    assert data[:4] == ZSTD_MAGIC
    result: dict[str, Any] = json.loads(zstandard.ZstdDecompressor().decompress(data))
    assert result["format"] == FORMAT_V2
    return result


def recompress(doc: dict[str, Any], *, content_size: bool = True) -> bytes:
    text = json.dumps(doc).encode()
    return bytes(zstandard.ZstdCompressor(write_content_size=content_size).compress(text))


def test_v2_manifest_is_compressed_columns_and_much_smaller_than_v1(chain: Chain) -> None:
    manifest = chain.delta.manifest
    compact = v2_bytes(chain)
    as_v1 = dump_document(
        {**tampering.as_v2(document(chain), chain.rebuilt_v1), "format": FORMAT_V1}
    )
    assert compact[:4] == ZSTD_MAGIC and as_v1[:1] == b"{"
    assert len(compact) < len(as_v1) / 2
    columns = stored_document(chain)["tensors"]
    assert columns["name"] == [t.name for t in manifest.tensors]
    assert columns["hash"] == "".join(t.hash for t in manifest.tensors)
    older = parse_manifest(compact)
    assert older.format == FORMAT_V2 and older.tensors == manifest.tensors
    assert [(f.path, f.size) for f in older.referenced] == [
        (f.path, f.size) for f in manifest.referenced
    ]


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


def test_any_version_accepts_tensors_as_objects_and_v1_refuses_the_context_codec(
    chain: Chain,
) -> None:
    doc = document(chain)
    assert parse_manifest(json.dumps(doc).encode()) == chain.delta.manifest
    doc = tampering.as_v2(doc, chain.rebuilt_v1)
    assert parse_manifest(json.dumps(doc).encode()).tensors == chain.delta.manifest.tensors
    doc["format"] = FORMAT_V1
    if any(t["codec"] == "context" for t in doc["tensors"]):
        with pytest.raises(ManifestInvalid):
            reparse(doc)
    for tensor in doc["tensors"]:
        tensor["codec"] = "context" if "data" in tensor else tensor["codec"]
    with pytest.raises(ManifestInvalid):
        reparse(doc)


# --- v3: the binary table ------------------------------------------------------------


def stored_table(chain: Chain) -> bytes:
    """The stored v3 manifest's table, out of its zstd frame."""
    data = (chain.snapshot / MANIFEST_NAME).read_bytes()
    assert data[:4] == ZSTD_MAGIC
    table = bytes(zstandard.ZstdDecompressor().decompress(data))
    assert table[: len(MAGIC)] == MAGIC
    return table


def framed(table: bytes) -> bytes:
    return bytes(zstandard.ZstdCompressor(write_content_size=True).compress(table))


def test_v3_manifest_is_a_table_smaller_than_v2(chain: Chain) -> None:
    manifest = chain.delta.manifest
    compact = manifest.dumps()
    assert len(compact) < len(v2_bytes(chain))
    assert parse_manifest(framed(stored_table(chain))) == manifest
    # each referenced file has no hash of its own: one sha256 commits to all of them
    assert all(f.hash is None for f in manifest.referenced)
    assert manifest.referenced_digest is not None
    # the payload holds a sparse or context tensor's change count: not repeated here
    counted = [t for t in manifest.tensors if t.codec.value in ("sparse", "context")]
    assert counted and all(t.changed is None for t in counted)


def test_v3_full_manifest_round_trips(chain: Chain) -> None:
    full = chain.full.manifest
    assert full.format == FORMAT and full.referenced_digest is None
    assert parse_manifest(full.dumps()) == full


def test_every_truncated_v3_table_is_manifest_invalid(chain: Chain) -> None:
    table = stored_table(chain)
    for end in range(len(table)):
        with pytest.raises(ManifestInvalid):
            parse_manifest(framed(table[:end]))


def test_every_garbled_v3_table_byte_fails_typed_or_parses(chain: Chain) -> None:
    """One changed byte anywhere: a typed ManifestInvalid (UnsafePath included), or a
    manifest that still passes every rule (a changed hash, size or count), never another
    exception."""
    table = stored_table(chain)
    refused = 0
    for at in range(len(table)):
        for mask in (0x01, 0x80, 0xFF):
            garbled = bytearray(table)
            garbled[at] ^= mask
            try:
                parse_manifest(framed(bytes(garbled)))
            except ManifestInvalid:
                refused += 1
    assert refused > len(table)  # most of the table is structure, not free values


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value >> 7 else 0))
        value >>= 7
        if not value:
            return bytes(out)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda t: t + b"\0", "bytes follow"),
        (lambda t: MAGIC + b"\x80\x00" + t[len(MAGIC) + 1 :], "non-canonical"),
        (lambda t: MAGIC + b"\xff" * 10 + t[len(MAGIC) :], "too long"),
        (lambda t: MAGIC + varint(1 << 40) + t[len(MAGIC) :], "too long|truncated"),
        (lambda t: MAGIC + varint(2) + b"\xc3\x28" + t[len(MAGIC) + 3 :], "UTF-8"),
    ],
)
def test_malformed_v3_tables_say_what_is_wrong(chain: Chain, edit: Any, match: str) -> None:
    with pytest.raises(ManifestInvalid, match=match):
        parse_manifest(framed(edit(stored_table(chain))))


def test_v3_table_indexes_and_counts_are_bounded(chain: Chain) -> None:
    from hotload.snapshot.manifest_table import CODECS, dump_table

    doc = document(chain)

    def refused(edit: Any, match: str) -> None:
        table = bytearray(dump_table(doc))
        edit(table)
        with pytest.raises(ManifestInvalid, match=match):
            parse_manifest(framed(bytes(table)))

    table = dump_table(doc)
    hashes = 16 * len(doc["tensors"])
    # the codec column sits just before the data columns; find it by its values
    codecs = bytes(CODECS.index(t["codec"]) for t in doc["tensors"])
    at = table.rindex(codecs, 0, len(table) - hashes)
    refused(lambda t: t.__setitem__(at, len(CODECS)), "unknown value")
    # the shard column (all 0: one shard) sits just before the codecs
    refused(lambda t: t.__setitem__(at - 1, 7), "no listed file")
    # the first tensor name shares nothing with a previous one
    names = table.index(doc["tensors"][0]["name"].encode()) - 2
    refused(lambda t: t.__setitem__(names, 5), "shares more")
    # the tensor count claims more rows than there are bytes
    count = names - 1
    assert table[count] == len(doc["tensors"])
    refused(lambda t: t.__setitem__(slice(count, count + 1), varint(1 << 14)), "longer than")


def test_v3_json_form_checks_the_referenced_commitment(chain: Chain) -> None:
    doc = document(chain)
    doc["referenced"][0]["hash"] = "0" * 64  # v3 gives none per file
    with pytest.raises(ManifestInvalid, match="referenced files"):
        reparse(doc)
    doc = document(chain)
    doc.pop("referencedDigest")
    with pytest.raises(ManifestInvalid, match="referencedDigest"):
        reparse(doc)
    doc = tampering.as_v2(document(chain), chain.rebuilt_v1)
    doc["referencedDigest"] = "0" * 64  # v2 has none
    with pytest.raises(ManifestInvalid, match="referencedDigest"):
        reparse(doc)
    doc = tampering.as_v2(document(chain), chain.rebuilt_v1)
    doc["referenced"][-1].pop("hash")  # v2 checks each file by its own hash
    with pytest.raises(ManifestInvalid, match="referenced files"):
        reparse(doc)


def test_a_raw_v3_table_outside_its_frame_is_refused(chain: Chain) -> None:
    with pytest.raises(ManifestInvalid):
        parse_manifest(stored_table(chain))

"""Hostile and broken input: each case a typed error, and nothing left behind.

Every test here corrupts one thing and checks (a) the exact error class, which is what
callers branch on and what becomes the pod's reason, and (b) that the output directory
does not exist and no temporary directory is left beside it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zstandard

from hotload.errors import (
    ChainBroken,
    ChecksumMismatch,
    DecodeFailed,
    HotloadError,
    ManifestInvalid,
    SizeLimitExceeded,
    UnsafePath,
)
from hotload.snapshot import REBUILT_NAME, encode, patch_tensors, rebuild, verify
from hotload.snapshot.codec.varint import write_varint
from hotload.snapshot.safetensors_file import read_header

from . import tampering
from .conftest import Chain, leftovers
from .models import base_tensors, nudge, write_model


def rebuild_fails(
    chain: Chain, error: type[HotloadError], previous: Path | None = None
) -> HotloadError:
    out = chain.root / "out"
    with pytest.raises(error) as caught:
        rebuild(previous or chain.rebuilt_v1, chain.snapshot, out, threads=2)
    assert not out.exists(), "a failed rebuild left its output"
    assert leftovers(chain.root) == [], "a failed rebuild left a temporary directory"
    return caught.value


def delta_file(chain: Chain) -> Path:
    return chain.snapshot / chain.delta.manifest.deltas[0].path


def test_truncated_delta_file_is_a_checksum_mismatch(chain: Chain) -> None:
    path = delta_file(chain)
    path.write_bytes(path.read_bytes()[:-10])
    error = rebuild_fails(chain, ChecksumMismatch)
    assert error.context["file"] == path.name


def test_one_flipped_byte_is_a_checksum_mismatch(chain: Chain) -> None:
    path = delta_file(chain)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    rebuild_fails(chain, ChecksumMismatch)
    with pytest.raises(ChecksumMismatch):
        verify(chain.snapshot)


def test_flipped_byte_behind_a_resigned_manifest_still_fails_typed(chain: Chain) -> None:
    """Past the sha256 gate the payload checks or the tensor hash must catch it."""
    document = tampering.load(chain.snapshot)
    entry = tampering.tensor(document, "embed.weight")
    payload = bytearray(tampering.read_range(chain.snapshot, entry["data"]))
    payload[-1] ^= 0x40
    tampering.replace_range(chain.snapshot, entry["data"], bytes(payload))
    tampering.resign(chain.snapshot, lambda d: d.update(tensors=document["tensors"]))
    rebuild_fails(chain, (DecodeFailed, ChecksumMismatch))  # type: ignore[arg-type]


def test_wrong_previous_snapshot_is_chain_broken(chain: Chain, tmp_path: Path) -> None:
    other = write_model(tmp_path / "other", {"model.safetensors": base_tensors(seed=42)})
    error = rebuild_fails(chain, ChainBroken, previous=other)
    assert error.context["previous"] == "s1"


def test_previous_holding_another_identity_is_chain_broken(chain: Chain) -> None:
    record = json.loads((chain.rebuilt_v1 / REBUILT_NAME).read_text())
    record["identity"] = "s0"
    (chain.rebuilt_v1 / REBUILT_NAME).write_text(json.dumps(record))
    error = rebuild_fails(chain, ChainBroken)
    assert error.context["found"] == "s0"


def test_referenced_file_differing_in_previous_is_chain_broken(chain: Chain) -> None:
    (chain.rebuilt_v1 / "tokenizer.json").write_text('{"vocab": ["changed"]}')
    error = rebuild_fails(chain, ChainBroken)
    assert error.context["file"] == "tokenizer.json"  # another size: named at once


def same_size_edit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_referenced_file_differing_in_content_only_fails_the_referenced_digest(
    chain: Chain,
) -> None:
    assert chain.delta.manifest.referenced_digest is not None
    same_size_edit(chain.rebuilt_v1 / "tokenizer.json")
    error = rebuild_fails(chain, ChainBroken)
    assert "tokenizer.json" in error.context["files"]


def test_a_lying_referenced_digest_is_chain_broken(chain: Chain) -> None:
    tampering.resign(chain.snapshot, lambda d: d.update(referencedDigest="0" * 64))
    rebuild_fails(chain, ChainBroken)


def test_v2_manifest_checks_each_referenced_file_by_its_own_hash(chain: Chain) -> None:
    document = tampering.as_v2(tampering.load(chain.snapshot), chain.rebuilt_v1)
    tampering.save(chain.snapshot, document)
    rebuild(chain.rebuilt_v1, chain.snapshot, chain.root / "ok")  # v2 still rebuilds
    same_size_edit(chain.rebuilt_v1 / "tokenizer.json")
    error = rebuild_fails(chain, ChainBroken)
    assert error.context["file"] == "tokenizer.json"


def test_manifest_listing_a_missing_file_is_a_checksum_mismatch(chain: Chain) -> None:
    delta_file(chain).unlink()
    rebuild_fails(chain, ChecksumMismatch)


def test_manifest_disagreeing_with_the_shard_header_is_manifest_invalid(chain: Chain) -> None:
    def lie(document: tampering.Document) -> None:
        tampering.tensor(document, "layer.0.weight")["shape"] = [16, 64]

    tampering.resign(chain.snapshot, lie)
    error = rebuild_fails(chain, ManifestInvalid)
    assert error.context["differing"] == ["layer.0.weight"]


def test_manifest_missing_a_tensor_of_the_header_is_manifest_invalid(chain: Chain) -> None:
    tampering.resign(
        chain.snapshot,
        lambda d: d.update(
            tensors=[t for t in d["tensors"] if t["name"] != "mask"], removed=["mask"]
        ),
    )
    rebuild_fails(chain, ManifestInvalid)


def test_removed_tensors_disagreeing_with_the_previous_is_chain_broken(chain: Chain) -> None:
    tampering.resign(chain.snapshot, lambda d: d.update(removed=["no.such.tensor"]))
    rebuild_fails(chain, ChainBroken)


def test_changed_count_disagreeing_with_the_payload_is_decode_failed(chain: Chain) -> None:
    # v3 leaves a sparse or context tensor's count to its payload; a manifest that
    # states one anyway (as v1/v2 did, or hand-written) must agree with it
    counted = next(t.changed for t in chain.delta.tensors if t.name == "embed.weight")
    assert counted

    def lie(document: tampering.Document) -> None:
        entry = tampering.tensor(document, "embed.weight")
        assert entry["codec"] in ("sparse", "context") and "changed" not in entry
        entry["changed"] = counted - 1

    tampering.resign(chain.snapshot, lie)
    rebuild_fails(chain, DecodeFailed)


def _frame_declaring(size: int, content: bytes) -> bytes:
    """A zstd frame for ``content`` whose header claims ``size`` bytes."""
    frame = zstandard.ZstdCompressor(level=3, write_content_size=False).compress(content)
    params = zstandard.ZstdCompressor(level=3).compress(b"\0" * size)
    header = zstandard.frame_header_size(params)
    return params[:header] + frame[zstandard.frame_header_size(frame) :]


def _dense_payload(chunk_elements: int, frames: list[bytes]) -> bytes:
    head = bytearray()
    write_varint(chunk_elements, head)
    for frame in frames:
        write_varint(len(frame), head)
    return bytes(head) + b"".join(frames)


def test_frame_declaring_more_than_its_chunk_is_a_size_bomb(chain: Chain) -> None:
    """A raw tensor whose frame declares 1 GiB: refused before anything is allocated."""

    def bomb(document: tampering.Document) -> None:
        entry = tampering.tensor(document, "int.table")
        big = zstandard.ZstdCompressor(level=3).compress(b"\0" * 1024)
        forged = bytearray(big)
        frame = _dense_payload(40, [_claim_size(bytes(forged), 1 << 30)])
        entry["codec"] = "raw"
        entry.pop("changed", None)
        tampering.replace_range(chain.snapshot, entry["data"], frame)

    tampering.resign(chain.snapshot, bomb)
    rebuild_fails(chain, SizeLimitExceeded)


def _claim_size(frame: bytes, size: int) -> bytes:
    """Rewrite a frame header's content size field to an 8-byte ``size``."""
    descriptor = frame[4]
    window_present = not (descriptor & 0x20)
    # Rebuild the header: FCS flag 3 (8 bytes), single segment off, window descriptor on.
    new_descriptor = (3 << 6) | (descriptor & 0x07)
    window = frame[5:6] if window_present else bytes([0x50])
    old_fcs = {0: 1 if descriptor & 0x20 else 0, 1: 2, 2: 4, 3: 8}[descriptor >> 6]
    start = 5 + (1 if window_present else 0)
    dict_id = {0: 0, 1: 1, 2: 2, 3: 4}[descriptor & 0x03]
    rest = frame[start + dict_id + old_fcs :]
    return frame[:4] + bytes([new_descriptor]) + window + size.to_bytes(8, "little") + rest


def test_frame_that_grows_past_its_declared_size_is_decode_failed(chain: Chain) -> None:
    """The frame claims exactly the chunk's size but holds more: zstd must stop it."""

    def bomb(document: tampering.Document) -> None:
        entry = tampering.tensor(document, "int.table")
        frame = zstandard.ZstdCompressor(level=3).compress(b"\x07" * 100_000)
        entry["codec"] = "raw"
        entry.pop("changed", None)
        tampering.replace_range(
            chain.snapshot, entry["data"], _dense_payload(40, [_claim_size(frame, 40)])
        )

    tampering.resign(chain.snapshot, bomb)
    rebuild_fails(chain, DecodeFailed)


def test_chunk_size_over_the_format_limit_is_refused(chain: Chain) -> None:
    def lie(document: tampering.Document) -> None:
        entry = tampering.tensor(document, "int.table")
        entry["codec"] = "raw"
        entry.pop("changed", None)
        tampering.replace_range(chain.snapshot, entry["data"], _dense_payload(1 << 30, [b""]))

    tampering.resign(chain.snapshot, lie)
    rebuild_fails(chain, DecodeFailed)


def test_oversized_manifest_is_refused_unread(chain: Chain) -> None:
    manifest = chain.snapshot / "hotload-manifest.json"
    with manifest.open("ab") as handle:
        handle.truncate(65 * 1024 * 1024)
    rebuild_fails(chain, SizeLimitExceeded)


@pytest.mark.parametrize(
    "name",
    ["../escape.bin", "/etc/passwd", "a//b", "./x", "sub/../../x", "c:\\evil", "x\x00y", ""],
)
def test_unsafe_file_names_are_refused(chain: Chain, name: str) -> None:
    def lie(document: tampering.Document) -> None:
        document["deltas"][0]["path"] = name

    tampering.resign(chain.snapshot, lie)
    rebuild_fails(chain, UnsafePath)


def test_unsafe_name_in_a_tensor_range_is_refused(chain: Chain) -> None:
    def lie(document: tampering.Document) -> None:
        tampering.tensor(document, "embed.weight")["data"]["file"] = "../s1/model.safetensors"

    tampering.resign(chain.snapshot, lie)
    rebuild_fails(chain, UnsafePath)


def test_symlink_escaping_the_previous_directory_is_refused(chain: Chain, tmp_path: Path) -> None:
    outside = tmp_path / "secret.json"
    outside.write_text("{}")
    (chain.rebuilt_v1 / "tokenizer.json").unlink()
    (chain.rebuilt_v1 / "tokenizer.json").symlink_to(outside)
    rebuild_fails(chain, UnsafePath)


def test_malformed_stored_safetensors_header_is_decode_failed(chain: Chain) -> None:
    bad_header = b'{"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 3]}}  '

    def lie(document: tampering.Document) -> None:
        shard = document["shards"][0]
        shard["header"] = {"file": document["deltas"][0]["path"], "offset": 0, "length": 0}
        frame = zstandard.ZstdCompressor(level=3).compress(bad_header)
        tampering.replace_range(chain.snapshot, shard["header"], frame)
        shard["headerLength"] = len(bad_header)
        from hotload.snapshot.digest import tensor_hash

        shard["headerHash"] = tensor_hash(bad_header)

    tampering.resign(chain.snapshot, lie)
    rebuild_fails(chain, DecodeFailed)


@pytest.mark.parametrize(
    "header",
    [
        b"not json at all",
        b'{"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 4]}}',
        b'{"w": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}}',
        b'{"w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}',
        b'{"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "w": {}}',
        b'{"w": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}}',
        b"[1, 2]",
    ],
)
def test_malformed_previous_safetensors_is_decode_failed(chain: Chain, header: bytes) -> None:
    shard = chain.rebuilt_v1 / "model.safetensors"
    shard.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)
    rebuild_fails(chain, DecodeFailed)


def test_safetensors_length_prefix_past_the_file_is_decode_failed(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes((1 << 20).to_bytes(8, "little") + b"{}")
    with pytest.raises(DecodeFailed):
        read_header(path)
    path.write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    with pytest.raises(SizeLimitExceeded):
        read_header(path)


def test_unknown_codec_id_is_manifest_invalid(chain: Chain) -> None:
    tampering.resign(
        chain.snapshot, lambda d: tampering.tensor(d, "embed.weight").update(codec="lzma-9")
    )
    rebuild_fails(chain, ManifestInvalid)


def test_unknown_format_version_is_manifest_invalid(chain: Chain) -> None:
    tampering.resign(chain.snapshot, lambda d: d.update(format="hotload-delta/v6"))
    error = rebuild_fails(chain, ManifestInvalid)
    assert error.context["found"] == "hotload-delta/v6"


def test_dtype_or_shape_mismatch_with_the_previous_tensor_is_decode_failed(chain: Chain) -> None:
    """The previous directory vouches (by its record) for the right snapshot, but one of
    its tensors has another shape: the decoder must refuse to patch it."""
    header = read_header(chain.v2 / "model.safetensors").header_bytes

    def store_header(document: tampering.Document) -> None:
        shard = document["shards"][0]
        shard["header"] = {"file": document["deltas"][0]["path"], "offset": 0, "length": 0}
        frame = zstandard.ZstdCompressor(level=3).compress(header)
        tampering.replace_range(chain.snapshot, shard["header"], frame)

    tampering.resign(chain.snapshot, store_header)
    tensors = base_tensors()
    tensors["layer.0.weight"] = ("BF16", tensors["layer.0.weight"][1].reshape(16, 64))
    (chain.rebuilt_v1 / "model.safetensors").unlink()
    write_model(chain.rebuilt_v1, {"model.safetensors": tensors})
    error = rebuild_fails(chain, DecodeFailed)
    assert error.context["tensor"] == "layer.0.weight"


def test_in_place_patch_with_a_mismatched_held_tensor_changes_nothing(chain: Chain) -> None:
    held = {name: data.copy() for name, (_, data) in base_tensors().items()}
    held["layer.0.weight"] = held["layer.0.weight"].astype(np.uint32)  # wrong dtype
    before = {name: array.copy() for name, array in held.items()}
    with pytest.raises(DecodeFailed):
        patch_tensors(held, chain.snapshot)
    assert held.keys() == before.keys()
    assert all(np.array_equal(held[n], before[n]) for n in held)


def test_in_place_patch_on_wrong_weights_is_undone(chain: Chain) -> None:
    held = {name: nudge(data, 0.1, 7) for name, (_, data) in base_tensors().items()}
    before = {name: array.copy() for name, array in held.items()}
    with pytest.raises(ChecksumMismatch):
        patch_tensors(held, chain.snapshot)
    assert all(np.array_equal(held[n], before[n]) for n in before)


def test_encoder_refuses_a_symlink_out_of_the_model_directory(tmp_path: Path) -> None:
    v1 = write_model(tmp_path / "v1", {"model.safetensors": base_tensors()})
    v2 = tmp_path / "v2"
    shutil.copytree(v1, v2)
    (v2 / "sub").mkdir()
    (v2 / "sub" / "evil.json").symlink_to(tmp_path / "nowhere")
    result = encode(v1, v2, tmp_path / "s", identity="s", step=1, previous_identity="p")
    assert "sub/evil.json" not in result.manifest.files_to_fetch()


def test_skipping_the_stored_file_hashes_never_yields_wrong_weights(chain: Chain) -> None:
    """The sidecar hashes stored files once (its verify phase) and tells rebuild so. A
    corruption after that check must then end in a typed error or in output that is still
    bit-exact (the rebuilt tensors' hashes decide), never in other weights, and a failed
    rebuild leaves nothing behind."""
    clean = chain.root / "clean"
    rebuild(chain.rebuilt_v1, chain.snapshot, clean)
    expected = (clean / "model.safetensors").read_bytes()
    path = delta_file(chain)
    original = path.read_bytes()
    caught = 0
    for position in range(0, len(original), max(1, len(original) // 24)):
        corrupted = bytearray(original)
        corrupted[position] ^= 0x5A
        path.write_bytes(bytes(corrupted))
        out = chain.root / f"out-{position}"
        try:
            rebuild(chain.rebuilt_v1, chain.snapshot, out, stored_verified=True)
        except (DecodeFailed, ChecksumMismatch, ManifestInvalid):
            caught += 1
            assert not out.exists()
            assert leftovers(chain.root) == []
        else:
            assert (out / "model.safetensors").read_bytes() == expected, position
    path.write_bytes(original)
    assert caught > 0, "no corruption was caught: the rebuilt-tensor check is not running"

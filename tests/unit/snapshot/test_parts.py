"""Snapshots stored as parts (hotload-delta/v4): a tensor's rows written by several writers
(the ranks of a sharded trainer), each range with its own codec in its own payload file.

Would catch: a parted snapshot rebuilding other bytes than a single process writing the
gathered weights; a delta's parts applied at the wrong offset (fresh rebuild, in place,
numpy and torch patches); parts that overlap, leave a gap or run past their tensor being
accepted; a v4 table or document that a v3 reader would misread instead of refuse; a
stored part whose bytes are not its size; hostile part tables crashing the reader.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hotload.errors import DecodeFailed, HotloadError, ManifestInvalid
from hotload.snapshot import (
    FORMAT_PARTS,
    MANIFEST_NAME,
    REBUILT_NAME,
    CodecId,
    inspect_snapshot,
    manifest_codec,
    manifest_table,
    parse_manifest,
    patch_tensors,
    read_manifest,
    rebuild,
    verify,
)
from hotload.snapshot.manifest_table import dump_table
from hotload.snapshot.tensor_files import mapped_shards

from . import tampering
from .conftest import SMALL_CHUNKS
from .models import Tensor, base_tensors, next_step, write_model
from .parting import row_ranges, write_parted_snapshot


def hashes(directory: Path) -> dict[str, str]:
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != REBUILT_NAME
    }


def gathered(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """The tensors as a single process writes a state_dict: sorted by name."""
    return dict(sorted(tensors.items()))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two steps of a model as single-process publishes lay them out, their parted Full
    and delta (3 writers), and the rebuilt previous."""
    root = tmp_path_factory.mktemp("parts")
    v1_tensors = gathered(base_tensors())
    v1 = write_model(root / "v1", {"model.safetensors": v1_tensors})
    v2 = write_model(root / "v2", {"model.safetensors": gathered(next_step(v1_tensors))})
    write_parted_snapshot(None, v1, root / "s1", identity="s1", step=1)
    rebuild(None, root / "s1", root / "r1")
    write_parted_snapshot(
        root / "r1",
        v2,
        root / "s2",
        identity="s2",
        step=2,
        previous_identity="s1",
        options=SMALL_CHUNKS,
    )
    return {"v1": v1, "v2": v2, "s1": root / "s1", "r1": root / "r1", "s2": root / "s2"}


def test_a_parted_full_rebuilds_the_single_process_bytes(models: dict[str, Path]) -> None:
    manifest = read_manifest(models["s1"])
    assert manifest.format == FORMAT_PARTS and manifest.has_parts
    assert {len(t.parts or ()) for t in manifest.tensors} == {3}
    assert hashes(models["r1"]) == hashes(models["v1"])


@pytest.mark.parametrize("in_place", [False, True])
def test_a_parted_delta_rebuilds_the_single_process_bytes(
    models: dict[str, Path], tmp_path: Path, in_place: bool
) -> None:
    verify(models["s2"])
    base = tmp_path / "base"
    rebuild(None, models["s1"], base)
    rebuild(base, models["s2"], tmp_path / "out", consume_previous=in_place)
    assert hashes(tmp_path / "out") == hashes(models["v2"])
    codecs = {p.codec for t in read_manifest(models["s2"]).tensors for p in t.parts or ()}
    assert {CodecId.UNCHANGED, CodecId.CONTEXT} <= codecs


def test_a_parted_delta_patches_held_arrays(models: dict[str, Path]) -> None:
    with mapped_shards(models["r1"], ["model.safetensors"]) as index:
        held = {name: index.words(name).copy() for name in index.by_name}
    written: list[tuple[str, int, int]] = []
    patch_tensors(
        held,
        models["s2"],
        held_identity="s1",
        on_change=lambda name, start, _pos, length: written.append((name, start, length)),
    )
    with mapped_shards(models["v2"], ["model.safetensors"]) as index:
        for name in index.by_name:
            assert np.array_equal(held[name].reshape(-1), index.words(name)), name
    # the changes reported are tensor positions: a part's chunk past the first writer's rows
    rows = row_ranges((64, 32), 3)
    assert any(name == "embed.weight" and start >= rows[1][0] for name, start, _ in written)


def test_a_parted_delta_patches_torch_tensors(models: dict[str, Path]) -> None:
    import torch

    from hotload.snapshot.torch_codec import patch_state_dict

    with mapped_shards(models["r1"], ["model.safetensors"]) as index:
        state = {
            name: torch.from_numpy(index.words(name).copy().view(_signed(index.words(name))))
            for name in index.by_name
        }
    patch_state_dict(state, models["s2"], held_identity="s1")
    with mapped_shards(models["v2"], ["model.safetensors"]) as index:
        for name in index.by_name:
            got = state[name].reshape(-1).numpy().view(index.words(name).dtype)
            assert np.array_equal(got, index.words(name)), name


def _signed(words: np.ndarray) -> Any:
    return {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}[words.dtype.itemsize]


def test_inspect_sums_the_parts(models: dict[str, Path]) -> None:
    report = inspect_snapshot(models["s2"])
    assert report.codec_counts() == {"parts": len(report.tensors)}
    mask = next(t for t in report.tensors if t.name == "mask")
    assert mask.changed == 0 and mask.stored_bytes == 0
    assert report.changed_fraction is not None and 0 < report.changed_fraction < 0.1


# --- what a reader refuses --------------------------------------------------------


def _document(models: dict[str, Path], name: str = "s2") -> dict[str, Any]:
    return tampering.load(models[name])


def _parts_of(document: dict[str, Any], tensor: str) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = tampering.tensor(document, tensor)["parts"]
    return parts


def _refused(document: dict[str, Any], match: str) -> None:
    with pytest.raises(ManifestInvalid, match="manifest does not satisfy") as caught:
        parse_manifest(json.dumps(document).encode())
    assert match in str(caught.value), str(caught.value)


def test_overlapping_parts_are_refused(models: dict[str, Path]) -> None:
    document = _document(models)
    _parts_of(document, "embed.weight")[1]["start"] -= 1
    _refused(document, "overlaps")


def test_a_missing_part_is_refused(models: dict[str, Path]) -> None:
    document = _document(models)
    del _parts_of(document, "embed.weight")[1]
    _refused(document, "missing")
    document = _document(models)
    _parts_of(document, "embed.weight").pop()
    _refused(document, "missing")


def test_a_part_past_its_tensor_is_refused(models: dict[str, Path]) -> None:
    document = _document(models)
    _parts_of(document, "embed.weight")[-1]["length"] += 1
    _refused(document, "ends past it")


def test_a_stored_part_of_another_size_is_refused(models: dict[str, Path]) -> None:
    document = _document(models, "s1")
    _parts_of(document, "layer.0.bias")[0]["data"]["length"] -= 4
    _refused(document, "stored part")


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda d: d.update(format="hotload-delta/v3"), "need hotload-delta/v4"),
        (lambda d: tampering.tensor(d, "mask").update(codec="sparse"), "disagree"),
        (lambda d: _parts_of(d, "mask")[0].update(codec="parts"), "parts"),
        (lambda d: d["shards"][0].pop("header"), "stores the header"),
    ],
)
def test_parts_break_no_other_rule(models: dict[str, Path], edit: Any, match: str) -> None:
    document = _document(models, "s1")
    edit(document)
    _refused(document, match)


def test_a_full_with_delta_codecs_in_parts_is_refused(models: dict[str, Path]) -> None:
    document = _document(models, "s1")
    _parts_of(document, "mask")[0].update(codec="sparse")
    _refused(document, "stored or raw")


def test_a_v3_reader_refuses_a_parted_manifest(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Today's replicas (readers of v1-v3) must refuse, not misread, a snapshot with
    parts: its table has another magic, its document another format."""
    stored = (models["s2"] / MANIFEST_NAME).read_bytes()
    as_json = json.dumps(_document(models)).encode()
    monkeypatch.setattr(manifest_codec, "READABLE_FORMATS", manifest_codec.READABLE_FORMATS[:3])
    monkeypatch.setattr(manifest_codec, "MAGICS", {manifest_table.MAGIC: "hotload-delta/v3"})
    for data in (stored, as_json):
        with pytest.raises(ManifestInvalid):
            parse_manifest(data)


def test_a_part_whose_payload_does_not_fit_fails_typed(
    models: dict[str, Path], tmp_path: Path
) -> None:
    snapshot = tmp_path / "s2"
    shutil.copytree(models["s2"], snapshot)

    def lie(document: dict[str, Any]) -> None:
        """The first part claims 512 fewer elements (2 chunks fewer), the second as many
        more: the parts still tile, their payloads no longer fit them."""
        first, second = _parts_of(document, "embed.weight")[:2]
        assert first["codec"] == "context"
        first["length"] -= 512
        second["start"] -= 512
        second["length"] += 512

    tampering.resign(snapshot, lie)
    with pytest.raises(DecodeFailed):
        verify(snapshot)
    with pytest.raises(HotloadError):
        rebuild(models["r1"], snapshot, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# --- hostile inputs, fuzzed -------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.integers(0, 80), st.integers(0, 40)), min_size=0, max_size=5))
def test_any_part_list_is_accepted_exactly_when_it_tiles(
    models: dict[str, Path], ranges: list[tuple[int, int]]
) -> None:
    document = _document(models, "s1")
    entry = tampering.tensor(document, "layer.0.bias")  # 32 F32 elements
    template = entry["parts"][0]
    entry["parts"] = [
        {**template, "start": s, "length": n, "codec": "unchanged"} for s, n in ranges
    ]
    for part in entry["parts"]:
        part.pop("data", None)
    document["kind"] = "Incremental"
    document["previous"] = "s0"
    document["previousDigest"] = "0" * 32
    for other in document["tensors"]:
        if other is not entry:
            other["parts"] = [{"start": 0, "length": _numel(other), "codec": "unchanged"}]
    tiles = _tiles(ranges, 32)
    try:
        manifest = parse_manifest(json.dumps(document).encode())
    except ManifestInvalid:
        assert not tiles
        return
    assert tiles
    table = dump_table(manifest.model_dump(mode="json", by_alias=True, exclude_none=True))
    framed = zstandard.ZstdCompressor().compress(table)
    assert parse_manifest(framed) == manifest


def _numel(entry: dict[str, Any]) -> int:
    return int(np.prod(entry["shape"])) if entry["shape"] else 1


def _tiles(ranges: list[tuple[int, int]], numel: int) -> bool:
    end = 0
    for start, length in ranges:
        if start != end or length < 1:
            return False
        end += length
    return end == numel


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_mutated_v4_tables_fail_typed(models: dict[str, Path], data: st.DataObject) -> None:
    manifest = read_manifest(models["s2"])
    table = bytearray(
        dump_table(manifest.model_dump(mode="json", by_alias=True, exclude_none=True))
    )
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(table) - 1))
        action = data.draw(st.sampled_from(["flip", "set", "cut"]))
        if action == "flip":
            table[at] ^= 1 << data.draw(st.integers(0, 7))
        elif action == "set":
            table[at] = data.draw(st.integers(0, 255))
        else:
            del table[at:]
            break
    framed = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(table))
    try:
        parsed = parse_manifest(framed)
    except ManifestInvalid:
        return
    # a mutation that still parses is a valid manifest: its parts still tile
    for tensor in parsed.tensors:
        if tensor.parts is not None:
            assert sum(p.length for p in tensor.parts) == tensor.numel

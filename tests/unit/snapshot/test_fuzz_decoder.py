"""Fuzz the whole decoder behind a re-signed manifest: typed errors, nothing left behind.

Re-signing the stored files' hashes after each mutation sends the lie past the sha256
gate, so the payload parser, the frame bounds, the header checks and the tensor hashes
are what stand between hostile bytes and a served model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hotload.errors import HotloadError
from hotload.snapshot import MANIFEST_NAME, encode, encode_full, rebuild

from . import tampering
from .conftest import SMALL_CHUNKS, leftovers
from .models import base_tensors, next_step, write_model


def _prepare(root: Path) -> tuple[Path, Path]:
    if not (root / "pristine").exists():
        tensors = base_tensors()
        v1 = write_model(root / "v1", {"model.safetensors": tensors})
        v2 = write_model(root / "v2", {"model.safetensors": next_step(tensors)})
        encode_full(v1, root / "s1", identity="s1", step=1)
        rebuild(None, root / "s1", root / "r1")
        encode(
            root / "r1",
            v2,
            root / "pristine",
            identity="s2",
            step=2,
            previous_identity="s1",
            options=SMALL_CHUNKS,
        )
    return root / "r1", root / "pristine"


def _case(tmp_path_factory: object, name: str) -> tuple[Path, Path, Path, Path]:
    """(root, previous, a fresh copy of the pristine snapshot, an absent output)."""
    root = Path(str(tmp_path_factory.getbasetemp())) / name  # type: ignore[attr-defined]
    previous, pristine = _prepare(root)
    snapshot = root / "case"
    out = root / "out"
    shutil.rmtree(snapshot, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(pristine, snapshot)
    return root, previous, snapshot, out


def _mutated(blob: bytearray, data: st.DataObject) -> bytes:
    """One to three flips, sets, insertions or a truncation, drawn by hypothesis."""
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(blob) - 1))
        kind = data.draw(st.sampled_from(["flip", "set", "truncate", "insert"]))
        if kind == "flip":
            blob[at] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "set":
            blob[at] = data.draw(st.integers(0, 255))
        elif kind == "truncate":
            blob = blob[: max(at, 1)]
        else:
            blob[at:at] = data.draw(st.binary(min_size=1, max_size=4))
    return bytes(blob)


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_mutated_delta_files_fail_typed(tmp_path_factory: object, data: st.DataObject) -> None:
    root, previous, snapshot, out = _case(tmp_path_factory, "fuzz-delta")
    delta = next(p for p in snapshot.iterdir() if p.name != MANIFEST_NAME)
    delta.write_bytes(_mutated(bytearray(delta.read_bytes()), data))
    tampering.resign(snapshot)
    try:
        rebuild(previous, snapshot, out, threads=2)
    except HotloadError:
        assert not out.exists()
    else:
        # zstd without checksums cannot see every flip; if it decoded, every tensor
        # hash matched, so the output must be exactly the current weights.
        assert (out / "model.safetensors").read_bytes() == (
            root / "v2" / "model.safetensors"
        ).read_bytes()
    assert leftovers(root) == []


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_mutated_manifests_fail_typed(tmp_path_factory: object, data: st.DataObject) -> None:
    root, previous, snapshot, out = _case(tmp_path_factory, "fuzz-manifest")
    document = tampering.load(snapshot)
    numbers = _number_slots(document)
    path, key = data.draw(st.sampled_from(numbers))
    container = document
    for part in path:
        container = container[part]
    container[key] = data.draw(
        st.one_of(st.integers(-2, 2**40), st.sampled_from([0, 1, 2**31, 2**63]))
    )
    tampering.save(snapshot, document)
    try:
        rebuild(previous, snapshot, out)
    except HotloadError:
        assert not out.exists()
    assert leftovers(root) == []


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_mutated_manifest_tables_fail_typed(tmp_path_factory: object, data: st.DataObject) -> None:
    """The v3 table's own bytes mutated (inside a valid zstd frame): the table reader and
    everything behind it answer with a typed error or a bit-exact rebuild."""
    root, previous, snapshot, out = _case(tmp_path_factory, "fuzz-table")
    manifest = snapshot / MANIFEST_NAME
    table = _mutated(
        bytearray(zstandard.ZstdDecompressor().decompress(manifest.read_bytes())), data
    )
    manifest.write_bytes(zstandard.ZstdCompressor(write_content_size=True).compress(table))
    try:
        rebuild(previous, snapshot, out)
    except HotloadError:
        assert not out.exists()
    else:  # a changed step or identity still rebuilds: the very same weights
        expected = (root / "v2" / "model.safetensors").read_bytes()
        assert (out / "model.safetensors").read_bytes() == expected
    assert leftovers(root) == []


def _number_slots(document: dict) -> list[tuple[tuple, str]]:  # type: ignore[type-arg]
    slots: list[tuple[tuple, str]] = []  # type: ignore[type-arg]

    def walk(node: object, path: tuple) -> None:  # type: ignore[type-arg]
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, int) and not isinstance(value, bool):
                    slots.append((path, key))
                else:
                    walk(value, (*path, key))
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, (*path, index))

    walk(document, ())
    return slots


def test_fuzz_fixture_is_a_valid_chain(tmp_path: Path) -> None:
    previous, pristine = _prepare(tmp_path)
    rebuild(previous, pristine, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "hotload-rebuilt.json").read_text())["identity"] == "s2"

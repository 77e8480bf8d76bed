"""v5: a delta naming a checkpoint, from the real encoder to the planner and the decoder.

A chain s1 (Full) → s2 → s3, and c2: a Full of s2's weights published beside the chain.
s3 names c2 as the checkpoint of s2, so a replica that holds nothing loads c2 and s3."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hotload.api import LoadPath
from hotload.api.formats import FORMAT_V4, FORMAT_V5
from hotload.errors import ManifestInvalid
from hotload.snapshot import (
    MANIFEST_NAME,
    Manifest,
    ManifestCheckpoint,
    encode,
    encode_full,
    parse_manifest,
    plan_update,
    read_manifest,
    rebuild,
)
from hotload.snapshot.manifest_codec import load_document
from hotload.snapshot.manifest_table import MAGIC_V5, dump_table

from .conftest import SMALL_CHUNKS
from .models import base_tensors, next_step, write_model


@dataclass(frozen=True)
class CheckpointedChain:
    root: Path
    s1: Path
    s2: Path
    s3: Path
    c2: Path
    v3: Path
    """s3's weights, as the trainer wrote them."""


@pytest.fixture
def checkpointed(tmp_path: Path) -> CheckpointedChain:
    t1 = base_tensors()
    t2 = next_step(t1)
    t3 = next_step(t2, seed=7)
    v1 = write_model(tmp_path / "v1", {"model.safetensors": t1})
    v2 = write_model(tmp_path / "v2", {"model.safetensors": t2})
    v3 = write_model(tmp_path / "v3", {"model.safetensors": t3})
    s1 = encode_full(v1, tmp_path / "s1", identity="s1", step=1).path
    s2 = encode(
        v1, v2, tmp_path / "s2", identity="s2", step=2, previous_identity="s1",
        options=SMALL_CHUNKS,
    ).path  # fmt: skip
    c2 = encode_full(v2, tmp_path / "c2", identity="c2", step=2).path
    s3 = encode(
        v2, v3, tmp_path / "s3", identity="s3", step=3, previous_identity="s2",
        options=SMALL_CHUNKS, checkpoint=ManifestCheckpoint(identity="c2", of="s2"),
    ).path  # fmt: skip
    return CheckpointedChain(tmp_path, s1, s2, s3, c2, v3)


def manifests(chain: CheckpointedChain) -> dict[str, Manifest]:
    return {p.name: read_manifest(p) for p in (chain.s1, chain.s2, chain.s3, chain.c2)}


def test_the_encoder_writes_v5_only_for_a_delta_naming_a_checkpoint(
    checkpointed: CheckpointedChain,
) -> None:
    known = manifests(checkpointed)
    assert known["s3"].format == FORMAT_V5
    assert known["s3"].checkpoint == ManifestCheckpoint(identity="c2", of="s2")
    assert known["s2"].format != FORMAT_V5 and known["s2"].checkpoint is None
    stored = (checkpointed.s3 / MANIFEST_NAME).read_bytes()
    assert parse_manifest(stored) == known["s3"]


def test_a_replica_with_nothing_rebuilds_from_the_checkpoint_bit_for_bit(
    checkpointed: CheckpointedChain,
) -> None:
    plan = plan_update(None, "s3", manifests(checkpointed))
    assert (plan.via, plan.apply) == (LoadPath.REPLAY, ("c2", "s3"))
    base = checkpointed.root / "r-c2"
    rebuild(None, checkpointed.c2, base)
    out = checkpointed.root / "r-s3"
    rebuild(base, checkpointed.s3, out, verify_previous=True)
    expected = (checkpointed.v3 / "model.safetensors").read_bytes()
    assert (out / "model.safetensors").read_bytes() == expected


def test_a_replica_on_the_chain_goes_by_deltas(checkpointed: CheckpointedChain) -> None:
    assert plan_update("s2", "s3", manifests(checkpointed)).apply == ("s3",)
    assert plan_update("s1", "s3", manifests(checkpointed)).apply == ("c2", "s3")


def test_the_v5_table_carries_the_checkpoint_and_a_v4_reader_would_refuse_it(
    checkpointed: CheckpointedChain,
) -> None:
    manifest = manifests(checkpointed)["s3"]
    document = manifest.model_dump(mode="json", by_alias=True, exclude_none=True)
    table = dump_table(document)
    assert table.startswith(MAGIC_V5)
    stored = load_document((checkpointed.s3 / MANIFEST_NAME).read_bytes())
    assert stored["checkpoint"] == {"identity": "c2", "of": "s2"}


def v5_document(chain: CheckpointedChain) -> dict[str, Any]:
    return load_document((chain.s3 / MANIFEST_NAME).read_bytes())


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda d: d.pop("checkpoint"), "(and only in) hotload-delta/v5"),
        (lambda d: d.update(format=FORMAT_V4), "(and only in) hotload-delta/v5"),
        (lambda d: d["checkpoint"].update(identity="s3"), "not of itself"),
        (lambda d: d["checkpoint"].update(of="s3"), "not of itself"),
        (lambda d: d["checkpoint"].update(of="c2"), "not a snapshot of it"),
        (lambda d: d["checkpoint"].update(identity="Bad/Name"), "checkpoint.identity"),
        (lambda d: d["checkpoint"].update(extra=1), "checkpoint.extra"),
    ],
)
def test_malformed_checkpoints_are_refused(
    checkpointed: CheckpointedChain, edit: Any, match: str
) -> None:
    document = v5_document(checkpointed)
    edit(document)
    with pytest.raises(ManifestInvalid) as caught:
        _validate(document)
    assert match in str(caught.value) + str(caught.value.context)


def _validate(document: dict[str, Any]) -> Manifest:
    return parse_manifest(json.dumps(document).encode())


def test_a_complete_snapshot_never_names_a_checkpoint(checkpointed: CheckpointedChain) -> None:
    document = load_document((checkpointed.c2 / MANIFEST_NAME).read_bytes())
    document.update(format=FORMAT_V5, checkpoint={"identity": "c1", "of": "s1"})
    with pytest.raises(ManifestInvalid, match="format") as caught:
        _validate(document)
    assert "only an Incremental" in str(caught.value.context)


def test_only_the_delta_after_the_checkpoints_snapshot_builds_on_the_checkpoint(
    checkpointed: CheckpointedChain,
) -> None:
    s3 = manifests(checkpointed)["s3"]
    assert s3.builds_on("s2") and s3.builds_on("c2")
    s4 = s3.model_copy(update={"identity": "s4", "step": 4, "previous": "s3"})
    assert s4.builds_on("s3") and not s4.builds_on("c2")
    assert not manifests(checkpointed)["s2"].builds_on("c2")

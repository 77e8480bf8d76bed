"""The torch path: state_dicts in, snapshots identical to the file path; patching in place.

On CPU here; ``tests/integration/snapshot/test_cuda_codec.py`` runs the same on CUDA.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hotload.errors import ChecksumMismatch
from hotload.snapshot import (
    CodecId,
    CodecOptions,
    encode_state_dict,
    rebuild,
)
from hotload.snapshot.codec.tensor_codec import NUMPY_WORDS, encode_tensor
from hotload.snapshot.codec.torch_words import TORCH_WORDS, words_of
from hotload.snapshot.torch_codec import patch_state_dict

DTYPES = [
    "bfloat16",
    "float16",
    "float32",
    "float8_e4m3fn",
    "float8_e5m2",
    "int8",
    "uint8",
    "int64",
]


def state(seed: int, device: str = "cpu") -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for index, name in enumerate(DTYPES):
        values = torch.randn(48, 40, generator=generator) * 0.05
        if name in ("int8", "uint8", "int64"):
            values = (values * 1000).round()
        out[f"t{index}.{name}"] = values.to(getattr(torch, name)).to(device)
    return out


def step(before: dict[str, Any], seed: int, fraction: float = 0.02) -> dict[str, Any]:
    """Move ``fraction`` of each tensor's elements by ±1 in their bits."""
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for name, tensor in before.items():
        words = words_of(tensor).clone()
        count = max(1, int(words.numel() * fraction))
        where = torch.randperm(words.numel(), generator=generator)[:count].to(words.device)
        moved = words[where].to(torch.int64) + 1
        if words.element_size() < 8:
            moved = moved & ((1 << (8 * words.element_size())) - 1)
            if words.dtype != torch.uint8:
                half = 1 << (8 * words.element_size() - 1)
                moved = torch.where(moved >= half, moved - 2 * half, moved)
        words[where] = moved.to(words.dtype)
        out[name] = words.view(tensor.dtype).reshape(tensor.shape)
    return out


def numpy_words(tensor: Any) -> np.ndarray:
    host = words_of(tensor).cpu().numpy()
    return host.view(np.dtype(f"u{host.dtype.itemsize}"))


@pytest.mark.parametrize(
    "codec", [CodecId.SPARSE, CodecId.DENSE_SUB, CodecId.DENSE_XOR, CodecId.RAW]
)
def test_torch_and_numpy_backends_write_identical_payloads(codec: CodecId) -> None:
    old, new = state(1), step(state(1), 2, fraction=0.1)
    options = CodecOptions(chunk_elements=500, codecs=(codec,))
    for name in old:
        a = encode_tensor(words_of(new[name]), words_of(old[name]), options, backend=TORCH_WORDS)
        b = encode_tensor(
            numpy_words(new[name]), numpy_words(old[name]), options, backend=NUMPY_WORDS
        )
        assert (a.codec, a.changed, a.payload) == (b.codec, b.changed, b.payload), name


def test_state_dict_delta_equals_the_file_path_delta(tmp_path: Path) -> None:
    old, new = state(3), step(state(3), 4)
    encode_state_dict(old, tmp_path / "s0", identity="s0", step=0)
    rebuild(None, tmp_path / "s0", tmp_path / "r0")
    from_files = encode_state_dict(
        new,
        tmp_path / "f1",
        identity="s1",
        step=1,
        previous=tmp_path / "r0",
        previous_identity="s0",
    )
    from_tensors = encode_state_dict(
        new,
        tmp_path / "t1",
        identity="s1",
        step=1,
        previous=old,
        previous_identity="s0",
    )
    strip = [t.model_copy(update={"data": None}) for t in from_files.manifest.tensors]
    assert strip == [t.model_copy(update={"data": None}) for t in from_tensors.manifest.tensors]
    assert from_tensors.manifest.previous_digest == from_files.manifest.previous_digest
    for a, b in zip(from_files.manifest.tensors, from_tensors.manifest.tensors, strict=True):
        if a.data is not None and b.data is not None:
            blob_a = (tmp_path / "f1" / a.data.file).read_bytes()
            blob_b = (tmp_path / "t1" / b.data.file).read_bytes()
            assert (
                blob_a[a.data.offset :][: a.data.length] == blob_b[b.data.offset :][: b.data.length]
            )
    rebuild(tmp_path / "r0", tmp_path / "t1", tmp_path / "r1")
    rebuild(tmp_path / "r0", tmp_path / "f1", tmp_path / "r1f")
    assert (tmp_path / "r1" / "model.safetensors").read_bytes() == (
        tmp_path / "r1f" / "model.safetensors"
    ).read_bytes()
    encode_state_dict(new, tmp_path / "direct", identity="s1", step=1)
    assert (tmp_path / "r1" / "model.safetensors").read_bytes() == (
        tmp_path / "direct" / "model.safetensors"
    ).read_bytes()


def test_patch_state_dict_in_place_is_bit_exact(tmp_path: Path) -> None:
    old, new = state(5), step(state(5), 6, fraction=0.3)
    new["added.weight"] = torch.ones(3, 3, dtype=torch.bfloat16)
    encode_state_dict(old, tmp_path / "s0", identity="s0", step=0)
    rebuild(None, tmp_path / "s0", tmp_path / "r0")
    encode_state_dict(
        new,
        tmp_path / "s1",
        identity="s1",
        step=1,
        previous=tmp_path / "r0",
        previous_identity="s0",
        options=CodecOptions(chunk_elements=300),
    )
    held = {name: tensor.clone() for name, tensor in old.items()}
    patch_state_dict(held, tmp_path / "s1", held_identity="s0")
    assert held.keys() == new.keys()
    for name, tensor in new.items():
        assert torch.equal(words_of(held[name]), words_of(tensor)), name
        assert held[name].dtype == tensor.dtype and held[name].shape == tensor.shape


def test_patch_state_dict_on_wrong_weights_changes_nothing(tmp_path: Path) -> None:
    old, new = state(7), step(state(7), 8)
    encode_state_dict(old, tmp_path / "s0", identity="s0", step=0)
    rebuild(None, tmp_path / "s0", tmp_path / "r0")
    encode_state_dict(
        new, tmp_path / "s1", identity="s1", step=1, previous=old, previous_identity="s0"
    )
    wrong = step(old, 99)
    held = {name: tensor.clone() for name, tensor in wrong.items()}
    with pytest.raises(ChecksumMismatch):
        patch_state_dict(held, tmp_path / "s1")
    for name, tensor in wrong.items():
        assert torch.equal(words_of(held[name]), words_of(tensor)), name

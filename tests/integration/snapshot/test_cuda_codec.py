"""The torch path on CUDA: bit-identical to the CPU path, encode and decode.

Skipped only when CUDA is absent (``@pytest.mark.gpu``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hotload.snapshot import CodecId, CodecOptions, encode_state_dict, rebuild  # noqa: E402
from hotload.snapshot.codec.tensor_codec import encode_tensor  # noqa: E402
from hotload.snapshot.codec.torch_words import words_of  # noqa: E402
from hotload.snapshot.torch_codec import patch_state_dict  # noqa: E402
from tests.unit.snapshot.test_torch_codec import state, step  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is absent"),
]


def on(device: str, tensors: dict[str, Any]) -> dict[str, Any]:
    return {name: tensor.to(device) for name, tensor in tensors.items()}


@pytest.mark.parametrize(
    "codec", [CodecId.SPARSE, CodecId.DENSE_SUB, CodecId.DENSE_XOR, CodecId.RAW]
)
def test_cuda_payloads_equal_cpu_payloads(codec: CodecId) -> None:
    old, new = state(11), step(state(11), 12, fraction=0.05)
    options = CodecOptions(chunk_elements=700, codecs=(codec,))
    for name in old:
        cpu = encode_tensor(words_of(new[name]), words_of(old[name]), options)
        gpu = encode_tensor(words_of(new[name].cuda()), words_of(old[name].cuda()), options)
        assert (gpu.codec, gpu.changed, gpu.payload) == (cpu.codec, cpu.changed, cpu.payload)


def test_cuda_state_dict_snapshot_equals_cpu_snapshot(tmp_path: Path) -> None:
    old, new = state(13), step(state(13), 14)
    cpu = encode_state_dict(
        new, tmp_path / "cpu", identity="s1", step=1, previous=old, previous_identity="s0"
    )
    gpu = encode_state_dict(
        on("cuda", new),
        tmp_path / "gpu",
        identity="s1",
        step=1,
        previous=on("cuda", old),
        previous_identity="s0",
    )
    for a, b in zip(
        sorted((tmp_path / "cpu").iterdir()), sorted((tmp_path / "gpu").iterdir()), strict=True
    ):
        assert a.name == b.name and a.read_bytes() == b.read_bytes()
    assert cpu.manifest == gpu.manifest


def test_cuda_patch_in_place_is_bit_exact(tmp_path: Path) -> None:
    old, new = state(15), step(state(15), 16, fraction=0.3)
    encode_state_dict(old, tmp_path / "s0", identity="s0", step=0)
    rebuild(None, tmp_path / "s0", tmp_path / "r0")
    encode_state_dict(
        new,
        tmp_path / "s1",
        identity="s1",
        step=1,
        previous=tmp_path / "r0",
        previous_identity="s0",
        options=CodecOptions(chunk_elements=256),
    )
    held = on("cuda", old)
    patch_state_dict(held, tmp_path / "s1", held_identity="s0")
    for name, tensor in new.items():
        assert held[name].is_cuda
        assert torch.equal(words_of(held[name]).cpu(), words_of(tensor)), name

"""Tiny model directories for the snapshot tests, written without torch.

``write_model`` lays out a Hugging Face directory (safetensors shards, optional index,
config.json, tokenizer.json) from numpy word arrays, so a test controls every bit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hotload.snapshot.dtypes import DTYPES
from hotload.snapshot.safetensors_file import build_header, length_prefix

Tensor = tuple[str, np.ndarray]  # (dtype name, words shaped like the tensor)


def words(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Random bit patterns of ``dtype`` (bf16-like values for 2-byte floats)."""
    rng = np.random.default_rng(seed)
    word = DTYPES[dtype].word
    if dtype in ("BF16",):
        values = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        return (values.view(np.uint32) >> 16).astype(np.uint16)
    if dtype == "F32":
        return (rng.standard_normal(shape) * 0.02).astype(np.float32).view(np.uint32)
    return rng.integers(0, np.iinfo(word).max, size=shape, dtype=word, endpoint=True)


def nudge(array: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """A copy with ``fraction`` of the elements moved by ±1 unit in the last place."""
    rng = np.random.default_rng(seed)
    out = array.copy().reshape(-1)
    count = max(1, int(len(out) * fraction)) if len(out) else 0
    where = rng.choice(len(out), size=count, replace=False)
    step = rng.choice(np.array([1, np.iinfo(out.dtype).max], dtype=out.dtype), size=count)
    out[where] += step
    return out.reshape(array.shape)


def write_shard(path: Path, tensors: Mapping[str, Tensor]) -> None:
    header, _ = build_header(
        [(name, DTYPES[dtype], tuple(data.shape)) for name, (dtype, data) in tensors.items()],
        {"format": "pt"},
    )
    with path.open("wb") as handle:
        handle.write(length_prefix(header) + header)
        for _, data in tensors.values():
            handle.write(np.ascontiguousarray(data).tobytes())


def write_model(
    root: Path,
    shards: Mapping[str, Mapping[str, Tensor]],
    *,
    config: dict[str, Any] | None = None,
    extra_files: Mapping[str, str] | None = None,
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, tensors in shards.items():
        write_shard(root / name, tensors)
    if len(shards) > 1:
        weight_map = {t: shard for shard, tensors in shards.items() for t in tensors}
        (root / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map}, sort_keys=True)
        )
    (root / "config.json").write_text(
        json.dumps(config or {"hidden_size": 8, "transformers_version": "4.0"})
    )
    for name, text in (extra_files or {"tokenizer.json": '{"vocab": []}'}).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def base_tensors(seed: int = 0) -> dict[str, Tensor]:
    """A small mixed-dtype model: big enough for several chunks with small chunk sizes."""
    return {
        "embed.weight": ("BF16", words("BF16", (64, 32), seed)),
        "layer.0.weight": ("BF16", words("BF16", (32, 32), seed + 1)),
        "layer.0.bias": ("F32", words("F32", (32,), seed + 2)),
        "layer.1.weight": ("F16", words("F16", (16, 32), seed + 3)),
        "quant.weight": ("F8_E4M3", words("F8_E4M3", (16, 16), seed + 4)),
        "quant.scale": ("F8_E5M2", words("F8_E5M2", (16,), seed + 5)),
        "int.table": ("I8", words("I8", (40,), seed + 6)),
        "mask": ("U8", words("U8", (24,), seed + 7)),
    }


def next_step(tensors: Mapping[str, Tensor], seed: int = 100) -> dict[str, Tensor]:
    """The next training step: most tensors nudged a little, one untouched, one rewritten."""
    out: dict[str, Tensor] = {}
    for index, (name, (dtype, data)) in enumerate(tensors.items()):
        if name == "mask":
            out[name] = (dtype, data.copy())
        elif name == "int.table":
            out[name] = (dtype, words(dtype, data.shape, seed + 999))
        else:
            out[name] = (dtype, nudge(data, 0.02, seed + index))
    return out

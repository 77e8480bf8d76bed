"""From a torch state_dict to a snapshot, through the same encoder as directories.

torch is imported only when these functions run, so the core never needs it. The
state_dict is written as safetensors (one shard, or several with an index when
``max_shard_bytes`` is set) into a temporary directory beside ``out``, together with
the non-tensor files of ``files_from`` (config, tokenizer), and encoded from there.
Tensors on any device are accepted; CUDA tensors are copied to the host.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from hotload.errors import ConfigError
from hotload.snapshot.codec.tensor_codec import CodecOptions
from hotload.snapshot.dtypes import DType, dtype_named
from hotload.snapshot.encoder import EncodeResult, encode
from hotload.snapshot.layout import SHARD_SUFFIX, scan
from hotload.snapshot.safetensors_file import build_header, length_prefix

if TYPE_CHECKING:
    import torch

TORCH_DTYPES: Final = {
    "bfloat16": "BF16",
    "float16": "F16",
    "float32": "F32",
    "float64": "F64",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "int8": "I8",
    "uint8": "U8",
    "int16": "I16",
    "int32": "I32",
    "int64": "I64",
    "bool": "BOOL",
}


def safetensors_dtype(tensor: torch.Tensor) -> DType:
    """The format's dtype for a torch tensor's dtype; ConfigError for an unsupported one."""
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in TORCH_DTYPES:
        raise ConfigError("unsupported tensor dtype", dtype=name)
    return dtype_named(TORCH_DTYPES[name])


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes in row-major order, on the host."""
    import torch

    flat = tensor.detach().contiguous().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    host: np.ndarray = flat.view(torch.uint8).numpy()
    return memoryview(host.data).cast("B")


def write_state_dict(
    state_dict: Mapping[str, Any], directory: Path, *, max_shard_bytes: int | None = None
) -> list[str]:
    """Write ``state_dict`` as safetensors shards into ``directory``; returns their names."""
    items = sorted(state_dict.items())
    groups: list[list[tuple[str, Any]]] = [[]]
    size = 0
    for name, tensor in items:
        nbytes = tensor.numel() * tensor.element_size()
        if max_shard_bytes is not None and groups[-1] and size + nbytes > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append((name, tensor))
        size += nbytes
    if len(groups) == 1:
        names = ["model" + SHARD_SUFFIX]
    else:
        names = [
            f"model-{i:05d}-of-{len(groups):05d}{SHARD_SUFFIX}" for i in range(1, len(groups) + 1)
        ]
    weight_map: dict[str, str] = {}
    total = 0
    for name, group in zip(names, groups, strict=True):
        header, _ = build_header(
            [(key, safetensors_dtype(t), tuple(t.shape)) for key, t in group], {"format": "pt"}
        )
        with (directory / name).open("wb") as handle:
            handle.write(length_prefix(header) + header)
            for key, tensor in group:
                data = tensor_bytes(tensor)
                handle.write(data)
                total += len(data)
                weight_map[key] = name
    if len(names) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return names


def encode_state_dict(
    state_dict: Mapping[str, Any],
    out: Path,
    *,
    identity: str,
    step: int,
    previous: Path | None = None,
    previous_identity: str | None = None,
    files_from: Path | None = None,
    ignored_config_fields: Iterable[str] = (),
    max_shard_bytes: int | None = None,
    options: CodecOptions = CodecOptions(),
    threads: int = 1,
) -> EncodeResult:
    """Encode a torch ``state_dict`` as a snapshot (Full without ``previous``, else a delta).

    ``files_from`` supplies the non-tensor files (config.json, tokenizer); its own
    safetensors files are not used.
    """
    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.weights-", dir=out.parent))
    try:
        if files_from is not None:
            for relpath in scan(files_from).others:
                target = scratch / relpath
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(files_from / relpath, target)
        write_state_dict(state_dict, scratch, max_shard_bytes=max_shard_bytes)
        return encode(
            previous,
            scratch,
            out,
            identity=identity,
            step=step,
            previous_identity=previous_identity,
            ignored_config_fields=ignored_config_fields,
            options=options,
            threads=threads,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

"""The format's dtypes for torch tensors (torch itself is imported only for type checks).

Shared by the writer of state_dicts (:mod:`hotload.snapshot.state_dict`) and the torch
codec (:mod:`hotload.snapshot.torch_codec`), so neither imports the other for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from hotload.errors import ConfigError
from hotload.snapshot.dtypes import DType, dtype_named

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

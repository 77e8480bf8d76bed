"""The weights a publish is made of, taken from the trainer without holding it up.

``capture`` is the only part that runs in the training loop's thread: a state_dict is
copied to host memory (in the snapshot's dtype), so the optimizer may move the live
tensors again at once; a directory is taken as it is (its files are copied later, by the
worker). ``materialize`` (worker thread) writes the snapshot's weights directory, which
stays in the work directory as the base of the next delta.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hotload.errors import ConfigError
from hotload.snapshot import ADAPTER_CONFIG
from hotload.snapshot.layout import scan
from hotload.snapshot.state_dict import write_state_dict


@dataclass(frozen=True)
class CapturedWeights:
    """A snapshot's weights as the worker gets them: host tensors or a directory."""

    tensors: Mapping[str, Any] | None = None
    """Host copies of a state_dict's tensors (torch), or None for a directory."""
    directory: Path | None = None

    @property
    def is_lora(self) -> bool:
        return self.directory is not None and (self.directory / ADAPTER_CONFIG).is_file()


def capture(weights: Mapping[str, Any] | Path, dtype: str | None = None) -> CapturedWeights:
    """Take the weights out of the trainer's hands (the time this takes is what the
    training step is blocked for)."""
    if isinstance(weights, Path):
        if not weights.is_dir():
            raise ConfigError("a snapshot directory must exist", directory=str(weights))
        return CapturedWeights(directory=weights.absolute())
    if not weights:
        raise ConfigError("the state_dict is empty")
    import torch

    target = torch_dtype(dtype) if dtype else None
    tensors: dict[str, Any] = {}
    for name, tensor in weights.items():
        if not isinstance(tensor, torch.Tensor):
            raise ConfigError("a state_dict maps names to tensors", tensor=name)
        value = tensor.detach()
        if target is not None and value.dtype != target:
            value = value.to(target)
        tensors[name] = value.to("cpu", copy=True).contiguous()
    return CapturedWeights(tensors=tensors)


def torch_dtype(name: str) -> Any:
    import torch

    value = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ConfigError("unknown torch dtype", dtype=name)
    return value


def materialize(captured: CapturedWeights, directory: Path, files_from: Path | None) -> Path:
    """Write the snapshot's weights directory (safetensors plus config and tokenizer)."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    if captured.directory is not None:
        shutil.copytree(captured.directory, directory, ignore=shutil.ignore_patterns(".*"))
        return directory
    if captured.tensors is None:
        raise ConfigError("captured weights hold neither tensors nor a directory")
    directory.mkdir()
    if files_from is not None:
        for relpath in scan(files_from).others:
            target = directory / relpath
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(files_from / relpath, target)
    write_state_dict(captured.tensors, directory)
    return directory

"""Read and validate a snapshot directory before the reference engine swaps it in.

Everything is checked before a single served weight changes, so a refusal leaves the
old weights serving: config.json (when present) must describe the same architecture;
every expected tensor must be there exactly once, with its shape and the storage dtype;
nothing unexpected may be there (tied aliases such as ``lm_head.weight`` are allowed and
must equal their canonical tensor). Refusals raise ``EngineRejected`` with the details;
the server answers them with 422.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import torch
from safetensors import SafetensorError, safe_open

from hotload.errors import EngineRejected

if TYPE_CHECKING:
    from transformers import Qwen2Config

CONFIG_FILE: Final = "config.json"
ADAPTER_CONFIG: Final = "adapter_config.json"
ADAPTER_WEIGHTS: Final = "adapter_model.safetensors"
_MAX_LISTED: Final = 5


#: Config fields that decide what the weights mean; a snapshot's config.json must agree.
ARCHITECTURE_FIELDS: Final = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "tie_word_embeddings",
    "rope_theta",
    "rms_norm_eps",
    "hidden_act",
)


@dataclass(frozen=True)
class ParamSpec:
    """What the engine expects of one stored tensor."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def architecture_of(config: Qwen2Config) -> dict[str, Any]:
    fields = config.to_dict()
    return {name: fields.get(name) for name in ARCHITECTURE_FIELDS}


def _listed(names: set[str]) -> list[str]:
    return sorted(names)[:_MAX_LISTED]


def check_config(directory: Path, architecture: Qwen2Config) -> None:
    """config.json, when the snapshot has one, must match the served architecture."""
    path = directory / CONFIG_FILE
    if not path.exists():
        return
    try:
        fields = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise EngineRejected("config.json is unreadable", path=str(path)) from err
    if not isinstance(fields, dict):
        raise EngineRejected("config.json is not an object", path=str(path))
    served = architecture_of(architecture)
    differences = {
        name: {"served": value, "snapshot": fields.get(name)}
        for name, value in served.items()
        if name in fields and fields[name] != value
    }
    if differences:
        raise EngineRejected(
            "the snapshot's config.json describes another architecture",
            path=str(path),
            differences=differences,
        )


def _weight_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise EngineRejected("the snapshot directory does not exist", path=str(directory))
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise EngineRejected(
            "the snapshot directory holds no *.safetensors file", path=str(directory)
        )
    return files


def read_tensors(files: list[Path]) -> dict[str, torch.Tensor]:
    """Every tensor of every file; a name in two files is refused."""
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                    if name in tensors:
                        raise EngineRejected(
                            "a tensor appears in two files", tensor=name, file=file.name
                        )
                    tensors[name] = handle.get_tensor(name)
        except (SafetensorError, OSError, ValueError) as err:
            raise EngineRejected(f"unreadable safetensors file: {err}", file=str(file)) from err
    return tensors


def read_full_snapshot(
    directory: Path,
    *,
    expected: Mapping[str, ParamSpec],
    aliases: Mapping[str, str],
    architecture: Qwen2Config,
) -> dict[str, torch.Tensor]:
    """The canonical tensors of a full snapshot, in their stored dtype, all checked."""
    check_config(directory, architecture)
    tensors = read_tensors(_weight_files(directory))
    for alias, canonical in aliases.items():
        if alias in tensors:
            aliased = tensors.pop(alias)
            if canonical in tensors and not torch.equal(
                aliased.view(torch.uint8), tensors[canonical].view(torch.uint8)
            ):
                raise EngineRejected(
                    "a tied alias differs from its tensor", tensor=alias, canonical=canonical
                )
            tensors.setdefault(canonical, aliased)
    missing = set(expected) - set(tensors)
    unexpected = set(tensors) - set(expected)
    if missing or unexpected:
        raise EngineRejected(
            "the snapshot's tensors do not match the model",
            path=str(directory),
            missing=_listed(missing),
            missing_count=len(missing),
            unexpected=_listed(unexpected),
            unexpected_count=len(unexpected),
        )
    for name, spec in expected.items():
        tensor = tensors[name]
        if tuple(tensor.shape) != spec.shape:
            raise EngineRejected(
                "a tensor has the wrong shape",
                tensor=name,
                expected_shape=list(spec.shape),
                shape=list(tensor.shape),
            )
        if tensor.dtype != spec.dtype:
            raise EngineRejected(
                "a tensor has the wrong dtype",
                tensor=name,
                expected_dtype=str(spec.dtype),
                dtype=str(tensor.dtype),
            )
    return tensors


def is_lora_directory(directory: Path) -> bool:
    return (directory / ADAPTER_CONFIG).is_file()


def read_lora_adapter(directory: Path) -> tuple[Any, dict[str, torch.Tensor]]:
    """The PEFT config and adapter tensors of a LoRA snapshot (refused unless LoRA)."""
    from peft import PeftConfig

    if not is_lora_directory(directory):
        raise EngineRejected("a LoRA snapshot needs adapter_config.json", path=str(directory))
    try:
        config = PeftConfig.from_pretrained(str(directory))
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise EngineRejected(f"adapter_config.json is invalid: {err}", path=str(directory)) from err
    if str(getattr(config, "peft_type", "")) not in ("LORA", "PeftType.LORA"):
        raise EngineRejected("only LoRA adapters are served", peft_type=str(config.peft_type))
    files = (
        [directory / ADAPTER_WEIGHTS]
        if (directory / ADAPTER_WEIGHTS).is_file()
        else _weight_files(directory)
    )
    return config, read_tensors(files)


def merge_lora(base: torch.nn.Module, directory: Path) -> torch.nn.Module:
    """A new model: a copy of ``base`` with the adapter in ``directory`` merged in (PEFT).

    ``base`` is never modified, so a refused adapter leaves the served model as it was and
    the next adapter applies to the same base. Costs one copy of the model in memory.
    """
    import copy

    from peft import get_peft_model, set_peft_model_state_dict

    peft_config, adapter = read_lora_adapter(directory)
    candidate = copy.deepcopy(base)
    try:
        peft_model = get_peft_model(candidate, peft_config)
        result = set_peft_model_state_dict(peft_model, adapter)
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise EngineRejected(
            f"the LoRA adapter does not fit the model: {err}", path=str(directory)
        ) from err
    unexpected = list(getattr(result, "unexpected_keys", None) or [])
    missing = [key for key in getattr(result, "missing_keys", None) or [] if "lora_" in key]
    if unexpected or missing:
        raise EngineRejected(
            "the LoRA adapter's tensors do not match its config",
            path=str(directory),
            unexpected=sorted(unexpected)[:_MAX_LISTED],
            missing=sorted(missing)[:_MAX_LISTED],
        )
    merged: torch.nn.Module = peft_model.merge_and_unload()
    merged.eval()
    merged.requires_grad_(False)
    return merged

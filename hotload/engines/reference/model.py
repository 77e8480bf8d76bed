"""The reference engine's model: a small Qwen2-style causal LM built from a config.

Trainers, tests and ``bench/swap`` build the *same* architecture from here, so weights
move between them by name and shape. No hub download: the config is code (``tiny`` for
tests, ``0.5b`` — the Qwen2.5-0.5B shape, ~494M parameters — for the swap benchmark) or a
``config.json`` path. Initial weights come from a seeded init, rounded to the config's
storage dtype (bf16 by default), so ``build_model(config, seed)`` is the same everywhere.

Weights are *stored* in the config's dtype (what snapshots hold) and *computed* in
``compute_dtype`` (float32 by default: bf16 matmuls on CPU are slow). The widening is
exact, so the served weights equal the snapshot's bit for bit; :func:`weights_digest`
proves it by hashing every parameter narrowed back to the storage dtype.

Token ids are bytes (see :mod:`hotload.engines.reference.tokenizer`), so vocabularies
start at 256 + the special tokens.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import torch
from safetensors.torch import save_file
from transformers import Qwen2Config, Qwen2ForCausalLM

from hotload.engines.reference.weights import CONFIG_FILE, ParamSpec, read_full_snapshot
from hotload.errors import ConfigError

WEIGHTS_FILE: Final = "model.safetensors"
DEFAULT_SEED: Final = 0

#: Named sizes. ``tiny`` keeps CPU tests fast; ``0.5b`` is Qwen2.5-0.5B's shape.
SIZES: Final[Mapping[str, Mapping[str, Any]]] = {
    "tiny": {
        "vocab_size": 320,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
    },
    "small": {
        "vocab_size": 320,
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
    },
    "0.5b": {
        "vocab_size": 151936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
    },
}

_DTYPES: Final = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def dtype_named(name: str) -> torch.dtype:
    """``torch.bfloat16`` for ``"bfloat16"`` (also accepts ``torch.bfloat16``'s str)."""
    key = name.removeprefix("torch.")
    if key not in _DTYPES:
        raise ConfigError("unsupported dtype", dtype=name, supported=sorted(_DTYPES))
    return _DTYPES[key]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def build_config(size_or_path: str | Path = "tiny", *, dtype: str = "bfloat16") -> Qwen2Config:
    """A named size (``tiny``, ``small``, ``0.5b``) or a ``config.json`` file/directory."""
    if isinstance(size_or_path, str) and size_or_path in SIZES:
        config = Qwen2Config(**{**SIZES[size_or_path], "dtype": dtype})
    else:
        path = Path(size_or_path)
        if path.is_dir():
            path = path / CONFIG_FILE
        try:
            fields = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ConfigError(
                "model config is neither a known size nor a readable config.json",
                config=str(size_or_path),
                sizes=sorted(SIZES),
            ) from err
        if fields.get("model_type") not in (None, "qwen2"):
            raise ConfigError(
                "the reference engine serves qwen2-style models",
                model_type=fields.get("model_type"),
            )
        fields.pop("model_type", None)
        stored = fields.pop("torch_dtype", None)
        fields["dtype"] = fields.get("dtype") or stored or dtype
        config = Qwen2Config(**fields)
    config._attn_implementation = "eager"  # one attention path everywhere: deterministic
    return config


def storage_dtype(config: Qwen2Config) -> torch.dtype:
    """The dtype snapshots of this config hold."""
    raw = getattr(config, "dtype", None) or "bfloat16"
    return raw if isinstance(raw, torch.dtype) else dtype_named(str(raw))


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def build_model(
    config: Qwen2Config, *, seed: int = DEFAULT_SEED, compute_dtype: torch.dtype = torch.float32
) -> Qwen2ForCausalLM:
    """The seeded initial model: weights rounded to the storage dtype, held in ``compute_dtype``."""
    with _seeded(seed):
        model = Qwen2ForCausalLM(config)
    torch.nn.Module.to(model, storage_dtype(config))
    torch.nn.Module.to(model, compute_dtype)
    torch.nn.Module.eval(model)
    model.requires_grad_(False)
    return model


def parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Canonical parameter names → tensors (tied aliases such as ``lm_head.weight`` dropped)."""
    return dict(model.named_parameters(remove_duplicate=True))


def tied_aliases(model: torch.nn.Module) -> dict[str, str]:
    """Alias name → canonical name for parameters shared under two names."""
    canonical: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        first = canonical.setdefault(id(param), name)
        if first != name:
            aliases[name] = first
    return aliases


def state_for_snapshot(model: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """What a snapshot of ``model`` stores: every canonical parameter in ``dtype``, contiguous."""
    return {
        name: param.detach().to(dtype).contiguous() for name, param in parameters(model).items()
    }


def save_snapshot(
    model: Qwen2ForCausalLM, directory: Path, *, dtype: torch.dtype | None = None
) -> Path:
    """Write a Hugging Face layout snapshot (config.json + model.safetensors) of ``model``."""
    stored = dtype or storage_dtype(model.config)
    directory.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    config["dtype"] = dtype_name(stored)
    config.pop("torch_dtype", None)
    config.pop("_attn_implementation_autoset", None)
    (directory / CONFIG_FILE).write_text(
        json.dumps(config, indent=2, sort_keys=True, default=str) + "\n"
    )
    save_file(
        state_for_snapshot(model, stored), str(directory / WEIGHTS_FILE), metadata={"format": "pt"}
    )
    return directory


def tensor_names(directory: Path) -> set[str]:
    """Names of every tensor in a directory's safetensors files (headers only)."""
    from safetensors import safe_open

    names: set[str] = set()
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            names.update(handle.keys())
    return names


def load_model(directory: Path, *, compute_dtype: torch.dtype = torch.float32) -> Qwen2ForCausalLM:
    """A model from a snapshot directory, strictly (the way the engine loads one)."""
    config = build_config(directory)
    model = build_model(config, compute_dtype=compute_dtype)
    weights = read_full_snapshot(
        directory,
        expected=parameter_specs(model, storage_dtype(config)),
        aliases=tied_aliases(model),
        architecture=config,
    )
    with torch.no_grad():
        for name, param in parameters(model).items():
            param.copy_(weights[name])
    return model


def parameter_specs(model: torch.nn.Module, dtype: torch.dtype) -> dict[str, ParamSpec]:
    return {name: ParamSpec(tuple(param.shape), dtype) for name, param in parameters(model).items()}


@dataclass(frozen=True)
class LogitsDigest:
    """A deterministic fingerprint of a forward pass (for bit-exact comparisons)."""

    sha256: str
    """sha256 of every position's float32 logits, row-major, little-endian."""
    shape: tuple[int, ...]
    last: list[float]
    """The last position's logits."""


_DIGEST_THREADS: Final = 1


def logits_digest(model: torch.nn.Module, token_ids: Sequence[int]) -> LogitsDigest:
    """Logits of one forward pass over ``token_ids``, computed with one thread so that the
    reduction order — and so every bit — is the same in every process."""
    threads = torch.get_num_threads()
    torch.set_num_threads(_DIGEST_THREADS)
    try:
        with torch.no_grad():
            logits = model(
                torch.tensor([list(token_ids)], dtype=torch.long), use_cache=False
            ).logits
    finally:
        torch.set_num_threads(threads)
    values = logits[0].to(torch.float32).contiguous()
    digest = hashlib.sha256(values.numpy().astype("<f4", copy=False).tobytes()).hexdigest()
    return LogitsDigest(sha256=digest, shape=tuple(values.shape), last=values[-1].tolist())


def weights_digest(model: torch.nn.Module, dtype: torch.dtype) -> str:
    """sha256 over every canonical parameter (sorted by name) narrowed to ``dtype``: equal
    digests mean the served weights equal the snapshot's bit for bit."""
    digest = hashlib.sha256()
    for name, tensor in sorted(state_for_snapshot(model, dtype).items()):
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()

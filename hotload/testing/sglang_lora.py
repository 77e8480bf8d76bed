"""SGLang 0.5.23's LoRA adapters as the fake serves them: registry, counters, unload.

Read in the release (``sglang/srt/...`` of ``sglang-0.5.23-cp311-...whl``, sha256 in
``tests/fixtures/engines/sglang-0.5.23/source.json``):

- ``/load_lora_adapter`` takes ``lora_update_lock`` and registers the name; a name already
  registered is refused ("already exists", ``lora/lora_registry.py:236-245``), as is one
  whose unload is incomplete (``managers/tokenizer_control_mixin.py:681-685``). Every name
  ever loaded stays in ``lora_ref_cache`` (``tokenizer_control_mixin.py:701``).
- ``/unload_lora_adapter`` takes the same lock, unregisters the name at once (new requests
  naming it no longer find it) and then **waits until every request using it has
  finished** (``tokenizer_control_mixin.py:633-657``, ``lora/lora_registry.py:109-124,
  186-203``). A request paused ``in_place`` is such a request: an unload sent while the
  engine is paused in place waits for the resume.
- A request resolves and counts its adapter only after the pause lets it in
  (``managers/tokenizer_manager.py:938-943`` then ``3723-3791``); a name not registered but
  in ``lora_ref_cache`` is loaded again implicitly from its old path
  (``tokenizer_manager.py:3758-3788``), one never loaded is refused.
- ``--enable-lora`` without ``--lora-paths`` needs both ``--max-lora-rank`` and
  ``--lora-target-modules``: the server refuses to start otherwise
  (``arg_groups/lora_hook.py:151-154``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hotload.errors import ConfigError

_LORA_ARGS_MESSAGE = (
    "When no initial --lora-paths is provided, you need to specify both --max-lora-rank "
    "and --lora-target-modules for LoRA initialization."
)


def check_lora_args(
    *,
    enable_lora: bool,
    lora_paths: Sequence[str],
    max_lora_rank: int | None,
    lora_target_modules: Sequence[str],
) -> None:
    """0.5.23's startup assertion on the LoRA arguments (``lora_hook.py:151-154``)."""
    if enable_lora and not (lora_paths or (max_lora_rank and lora_target_modules)):
        raise ConfigError(_LORA_ARGS_MESSAGE, enable_lora=True)


def lora_args_of(args: Sequence[str]) -> dict[str, Any]:
    """The LoRA arguments of an SGLang command line, as :func:`check_lora_args` takes them
    (``--lora-paths`` and ``--lora-target-modules`` take several values, as in 0.5.23)."""
    found: dict[str, Any] = {
        "enable_lora": False,
        "lora_paths": [],
        "max_lora_rank": None,
        "lora_target_modules": [],
    }
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--enable-lora":
            found["enable_lora"] = True
        elif arg == "--max-lora-rank" and index + 1 < len(args):
            found["max_lora_rank"] = int(args[index + 1])
            index += 1
        elif arg in ("--lora-paths", "--lora-target-modules"):
            values = []
            while index + 1 < len(args) and not args[index + 1].startswith("--"):
                values.append(args[index + 1])
                index += 1
            found["lora_paths" if arg == "--lora-paths" else "lora_target_modules"] = values
            if arg == "--lora-paths" and values:
                found["enable_lora"] = True  # lora_hook.py: --lora-paths implies it
        index += 1
    return found


@dataclass
class LoraRequest:
    """One request's hold on an adapter (``lora_registry.acquire`` / ``release``)."""

    registry: FakeLoraRegistry
    name: str

    async def admit(self) -> None:
        await self.registry.acquire(self.name)

    async def release(self) -> None:
        await self.registry.release(self.name)


class FakeLoraRegistry:
    """The adapters a fake SGLang holds, with the released locking (module doc)."""

    def __init__(self, exists: Callable[[str], bool]) -> None:
        self._exists = exists
        self.registered: dict[str, str] = {}
        """``lora_registry._registry``: name -> path, what requests may use now."""
        self.cache: dict[str, str] = {}
        """``lora_ref_cache``: every name ever loaded (an unloaded one reloads on use)."""
        self.in_use: Counter[str] = Counter()
        self.pending_unloads: set[str] = set()
        self._update_lock = asyncio.Lock()
        self._released = asyncio.Condition()

    async def load(self, name: str, path: str) -> str | None:
        """Register ``name``; the error message when refused."""
        async with self._update_lock:
            return self._load_locked(name, path)

    def _load_locked(self, name: str, path: str) -> str | None:
        if name in self.pending_unloads:
            return (
                f"LoRA adapter '{name}' has an incomplete unload. "
                "Retry the unload before loading it again."
            )
        if not self._exists(path):
            return f"Failed to load LoRA adapter {name}: no adapter found at {path}"
        if name in self.registered:
            return f"LoRA with name {name} already exists. Loaded LoRAs: {list(self.registered)}"
        self.registered[name] = path
        self.cache[name] = path
        return None

    async def unload(self, name: str) -> str | None:
        """Unregister ``name`` and wait until no request uses it; the error when refused."""
        async with self._update_lock:
            if name not in self.pending_unloads:
                if name not in self.registered:
                    return (
                        f"LoRA with name {name} does not exist. "
                        f"Loaded LoRAs: {list(self.registered)}"
                    )
                del self.registered[name]
                self.pending_unloads.add(name)
            async with self._released:
                await self._released.wait_for(lambda: self.in_use[name] == 0)
            self.pending_unloads.discard(name)
            return None

    def refusal(self, name: str) -> str | None:
        """Why a request naming ``name`` would be refused before it runs, if it would."""
        if name in self.registered or name in self.cache:
            return None
        return f"Got LoRA adapter that has never been loaded: {name}"

    async def acquire(self, name: str) -> None:
        """Count a request on ``name``, loading it again if it was unloaded since
        (``ValueError``, SGLang's own, when it cannot)."""
        if name not in self.registered:
            if name not in self.cache:
                raise ValueError(f"Got LoRA adapter that has never been loaded: {name}")
            error = await self.load(name, self.cache[name])
            if error is not None and "already" not in error:
                raise ValueError(f"Failed to implicitly load LoRA adapter {name}: {error}")
        self.in_use[name] += 1

    async def release(self, name: str) -> None:
        async with self._released:
            self.in_use[name] -= 1
            self._released.notify_all()

    def describe(self) -> dict[str, Any]:
        return {
            "registered": dict(self.registered),
            "in_use": {name: count for name, count in self.in_use.items() if count},
            "pending_unloads": sorted(self.pending_unloads),
        }


def adapter_dir_exists(root: Path | None) -> Callable[[str], bool]:
    """Whether an adapter path (as the engine sees it) is a directory on this host."""
    from hotload.mounts import host_path

    return lambda path: host_path(path, root).is_dir()

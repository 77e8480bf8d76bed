"""Directories the vLLM adapter's contract tests hand it, made real.

The adapter reads a directory's safetensors headers before it asks vLLM to load it
(hotload.engines.checkpoint_check), where the sidecar sees it: under ``$HOTLOAD_ROOT``.
``checkpoints`` points ``HOTLOAD_ROOT`` at a temporary root holding every path those tests
name, each with a small, complete safetensors file (and a PEFT config).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

#: Every directory the vLLM contract tests load from (as the engine is handed it).
PATHS = (
    "/staging/step-2", "/staging/a", "/staging/b", "/staging/a/step-2", "/staging/b/s-3",
    "/staging/a/l-1", "/staging/0/s-1", "/staging/1/s-2", "/staging/0/l-1",
    "/s/x", "/s/l", "/s/lora-a", "/s/lora-b",
)  # fmt: skip


@pytest.fixture
def checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for path in PATHS:
        directory = tmp_path / path.lstrip("/")
        directory.mkdir(parents=True, exist_ok=True)
        save_file({"w": np.ones((2, 2), np.float32)}, str(directory / "model.safetensors"))
        (directory / "adapter_config.json").write_text("{}")
    monkeypatch.setenv("HOTLOAD_ROOT", str(tmp_path))
    return tmp_path

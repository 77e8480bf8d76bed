"""Check a directory before an engine without rollback is asked to load it.

vLLM's ``reload_weights`` moves every layer to the meta device before it reads a file:
a missing directory, a corrupt safetensors header or a truncated file then leave it
with no weights at all — ``/health`` still answers 200 and the next request kills the
engine (measured on 0.32.0, docs/engines.md "A real vLLM here"). Every one of those is
visible from the files' headers, which cost a few hundred bytes each to read, so the
adapter reads them first and refuses the load (:class:`~hotload.errors.LoadNotStarted`,
an ``EngineRejected``) without sending anything: the engine keeps serving what it served.

The directory is read where the sidecar sees it: the path the engine is handed is a
mount path, which the local pod runtime roots at ``$HOTLOAD_ROOT`` (:mod:`hotload.mounts`;
in a real pod the two are the same path).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Final

from hotload.errors import LoadNotStarted
from hotload.mounts import host_path, root_from

_MAX_HEADER: Final = 100 * 1024 * 1024
"""safetensors' own bound on a header's size."""


def local_view(path: Path) -> Path:
    """Where the engine's ``path`` (a mount path) lives for this process."""
    root = root_from(os.environ.get("HOTLOAD_ROOT"))
    return host_path(str(path), root) if path.is_absolute() else path


def _refuse(message: str, path: Path, **context: object) -> LoadNotStarted:
    return LoadNotStarted(message, path=str(path), **context)


def check_safetensors(file: Path) -> None:
    """``LoadNotStarted`` unless ``file`` has a readable header whose tensors end exactly
    where the file ends."""
    try:
        with file.open("rb") as handle:
            size = file.stat().st_size
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise _refuse("a weights file is shorter than its header", file, size=size)
            (length,) = struct.unpack("<Q", prefix)
            if length > _MAX_HEADER or 8 + length > size:
                raise _refuse("a weights file's header is corrupt", file, header_bytes=length)
            header = json.loads(handle.read(length))
    except OSError as err:
        raise _refuse(f"a weights file cannot be read: {err}", file) from err
    except (ValueError, UnicodeDecodeError) as err:
        raise _refuse("a weights file's header is not JSON", file) from err
    if not isinstance(header, dict):
        raise _refuse("a weights file's header is not a JSON object", file)
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2):
            raise _refuse("a header names a tensor without offsets", file, tensor=name)
        end = max(end, int(offsets[1]))
    if 8 + length + end != size:
        raise _refuse(
            "a weights file is truncated or padded (its header says otherwise)",
            file,
            expected_bytes=8 + length + end,
            size=size,
        )


def check_checkpoint(path: Path, *, adapter: bool = False) -> None:
    """``LoadNotStarted`` unless ``path`` is a directory of readable, complete
    safetensors files (``adapter``: a PEFT directory with ``adapter_config.json``)."""
    local = local_view(path)
    if not local.is_dir():
        raise _refuse("the directory to load does not exist", path)
    if adapter and not (local / "adapter_config.json").is_file():
        raise _refuse("a LoRA directory without adapter_config.json", path)
    files = sorted(local.glob("*.safetensors"))
    if not files:
        raise _refuse("the directory to load holds no *.safetensors file", path)
    for file in files:
        check_safetensors(file)

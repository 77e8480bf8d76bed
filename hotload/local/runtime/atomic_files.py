"""Files a reader may open at any moment (kubeconfigs, tokens, ``services.json``).

Write to a temporary name in the same directory, then rename: a reader sees the old file
or the new one, never half of one. No fsync: these files live as long as the runtime's
pods and are rewritten on restart, so durability across a power cut buys nothing, and a
thousand pods' kubeconfigs must not wait on the disk.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, value: Any, mode: int = 0o644) -> None:
    atomic_write(path, (json.dumps(value, indent=2, sort_keys=True) + "\n").encode(), mode)

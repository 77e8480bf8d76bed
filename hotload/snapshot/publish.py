"""Upload an encoded snapshot directory to a bucket, the manifest last.

The manifest is what makes a snapshot exist (CONTRACTS.md, "Names and identity"): a reader
that finds it can trust every file it lists to be complete, so every other file goes first.
Used by the trainer side (the demo now, ``hotload publish`` later).
"""

from __future__ import annotations

from pathlib import Path

from hotload.errors import ManifestInvalid
from hotload.snapshot.manifest import MANIFEST_NAME
from hotload.storage import Storage


def snapshot_files(directory: Path) -> list[str]:
    """Relative paths of the snapshot's files, in upload order (the manifest last)."""
    files = sorted(
        str(path.relative_to(directory)) for path in directory.rglob("*") if path.is_file()
    )
    if MANIFEST_NAME not in files:
        raise ManifestInvalid("no manifest in the snapshot directory", directory=str(directory))
    return [name for name in files if name != MANIFEST_NAME] + [MANIFEST_NAME]


async def publish_snapshot(storage: Storage, directory: Path, identity: str) -> list[str]:
    """Put ``directory`` under ``<identity>/`` in ``storage``; the keys written, in order."""
    keys = []
    for relpath in snapshot_files(directory):
        key = f"{identity}/{relpath}"
        await storage.put_file(key, directory / relpath)
        keys.append(key)
    return keys

"""The staging volume's layout: downloads and rebuilt snapshots.

Staging is the pod's ``emptyDir`` (medium Memory) shared with the engine; it outlives a
sidecar restart, which is what lets a killed sidecar resume its downloads and keep using
the snapshot it had rebuilt::

    <staging>/fetch/<identity>/<file>     stored files as in the bucket (``.part`` and
                                          ``.part.json`` while downloading), plus the
                                          snapshot's manifest
    <staging>/snapshots/<identity>/       a rebuilt, verified Hugging Face directory (the
                                          decoder's record of what it holds inside): the
                                          only thing the engine is ever handed
    <staging>/snapshots/.<name>.partial-* a rebuild in progress (never handed over)

The decoder writes a rebuild under a temporary name and renames it only when every
checksum passed, so "a directory under ``snapshots/`` whose record names it" means
"verified". The engine is handed the *mount path*
(``/var/lib/hotload/staging/snapshots/<identity>``) and maps it through its own
``HOTLOAD_ROOT``, as every container of the pod does.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from hotload.api import SnapshotKind
from hotload.api.pod import STAGING_MOUNT_PATH
from hotload.snapshot import REBUILT_NAME

log = logging.getLogger(__name__)

FETCH = "fetch"
SNAPSHOTS = "snapshots"
#: The decoder's record is a few hundred bytes; anything bigger is not one.
_RECORD_LIMIT = 64 * 1024


def _read_record(directory: Path) -> dict[str, Any] | None:
    """The decoder's record of what a rebuilt directory holds (``hotload-rebuilt.json``)."""
    path = directory / REBUILT_NAME
    try:
        if not path.is_file() or path.stat().st_size > _RECORD_LIMIT:
            return None
        record = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


@dataclass(frozen=True)
class StagedRecord:
    """What a verified rebuild in staging holds (from the decoder's record)."""

    identity: str
    step: int
    kind: SnapshotKind


class StagingArea:
    """Paths and housekeeping of one pod's staging volume (``root`` on this host)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def prepare(self) -> None:
        """Create the layout and drop rebuilds a previous run left half-done."""
        for name in (FETCH, SNAPSHOTS):
            (self.root / name).mkdir(parents=True, exist_ok=True)
        for entry in (self.root / SNAPSHOTS).iterdir():
            if entry.name.startswith("."):
                shutil.rmtree(entry, ignore_errors=True)

    def fetch_dir(self, identity: str) -> Path:
        return self.root / FETCH / identity

    def snapshot_dir(self, identity: str) -> Path:
        """Where the verified rebuild of ``identity`` lives on this host."""
        return self.root / SNAPSHOTS / identity

    def record(self, identity: str) -> StagedRecord | None:
        """The verified rebuild of ``identity``, or None when staging has none."""
        record = _read_record(self.snapshot_dir(identity))
        if record is None or record.get("identity") != identity:
            return None
        step, kind = record.get("step"), record.get("kind")
        if not isinstance(step, int) or not isinstance(kind, str):
            return None
        try:
            return StagedRecord(identity, step, SnapshotKind(kind))
        except ValueError:
            return None

    def has_snapshot(self, identity: str) -> bool:
        return self.record(identity) is not None

    @staticmethod
    def engine_path(identity: str) -> Path:
        """The path the engine is handed: under the staging *mount path*, not this host's."""
        return Path(PurePosixPath(STAGING_MOUNT_PATH) / SNAPSHOTS / identity)

    def discard_snapshot(self, identity: str) -> None:
        shutil.rmtree(self.snapshot_dir(identity), ignore_errors=True)

    def clean(self, keep_snapshots: set[str], keep_fetches: set[str]) -> list[str]:
        """Remove every rebuilt snapshot and download not kept; the names removed."""
        removed: list[str] = []
        for entry in sorted((self.root / SNAPSHOTS).iterdir()):
            if entry.name not in keep_snapshots:
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(f"{SNAPSHOTS}/{entry.name}")
        for entry in sorted((self.root / FETCH).iterdir()):
            if entry.name not in keep_fetches:
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(f"{FETCH}/{entry.name}")
        if removed:
            log.info("staging cleaned", extra={"removed": removed})
        return removed

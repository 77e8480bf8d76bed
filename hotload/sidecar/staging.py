"""The staging volume: downloads, and two buffers of verified rebuilds.

Staging is the pod's ``emptyDir`` (medium Memory) shared with the engine; it outlives a
sidecar restart, which is what lets a killed sidecar resume its downloads and know which
buffer the engine may still be reading::

    <staging>/fetch/<identity>/<file>       complete downloads as in the bucket, plus the
                                            snapshot's manifest (a verified delta here is
                                            what an engine that patches in place is handed)
    <staging>/partial/<identity>/<file>.part(.json)
                                            downloads in progress: outside the snapshot's
                                            own names, so a file may be called x.part
    <staging>/buffers/<a|b>/<identity>/     a verified rebuild (the decoder's record of it
                                            inside): the only thing an engine is handed
    <staging>/buffers/<a|b>/.<identity>.partial-*
                                            a rebuild in progress (never handed over)
    <staging>/buffers.json                  which buffer is served, which one was handed
                                            to the engine with its outcome unknown

**Two buffers** (CONTRACTS.md, "Staging has two buffers"): a directory an engine serves
from, or may still be reading, is never written. A new snapshot is built in the other
buffer and handed over; the roles swap once the engine confirmed the load. Before a
buffer is handed, ``buffers.json`` says so (fsync'd): a sidecar that dies mid-swap comes
back knowing that buffer may be in use. Two model-sized buffers count against the pod's
memory (the volume is a Memory ``emptyDir``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from hotload.api import SnapshotKind
from hotload.api.kinds import Identity
from hotload.api.pod import STAGING_MOUNT_PATH
from hotload.errors import ChecksumMismatch, HotloadError
from hotload.sidecar.planning import Buffers, Slot, Staged
from hotload.snapshot import REBUILT_NAME
from hotload.snapshot.layout import scan
from hotload.snapshot.tensor_files import mapped_shards

log = logging.getLogger(__name__)

FETCH = "fetch"
PARTIAL = "partial"
BUFFERS = "buffers"
STATE_FILE = "buffers.json"
#: The decoder's record is a few hundred bytes; anything bigger is not one.
_RECORD_LIMIT = 64 * 1024
_STATE_LIMIT = 64 * 1024


def _read_json(path: Path, limit: int) -> dict[str, Any] | None:
    try:
        if not path.is_file() or path.stat().st_size > limit:
            return None
        document = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def read_record(directory: Path) -> Staged | None:
    """What a rebuilt directory holds, from the decoder's record; None if it has none."""
    record = _read_json(directory / REBUILT_NAME, _RECORD_LIMIT)
    if record is None or record.get("identity") != directory.name:
        return None
    step, kind, digest = record.get("step"), record.get("kind"), record.get("tensorDigest")
    if not isinstance(step, int) or not isinstance(kind, str):
        return None
    try:
        return Staged(
            directory.name, step, SnapshotKind(kind), digest if isinstance(digest, str) else None
        )
    except ValueError:
        return None


def directory_digest(directory: Path) -> str:
    """The tensor-set digest of a rebuilt directory, every tensor hashed now."""
    model = scan(directory)
    with mapped_shards(directory, list(model.shards)) as index:
        return index.digest()


def write_whole(path: Path, data: bytes) -> None:
    """``data`` at ``path`` whole or not at all: a temporary sibling, fsync'd and renamed,
    removed when the write fails (a full volume keeps no half file)."""
    temp = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class BufferRoles:
    """What ``buffers.json`` says."""

    served: Slot | None = None
    handed: Slot | None = None


class StagingArea:
    """Paths and housekeeping of one pod's staging volume (``root`` on this host).

    Only the agent's one job at a time writes here (one owner of staging); every write is
    to a buffer that is neither served nor handed.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    # --- layout ---------------------------------------------------------------------------

    def prepare(self) -> None:
        """Create the layout and drop rebuilds a previous run left half-done."""
        for name in (FETCH, PARTIAL, BUFFERS):
            (self.root / name).mkdir(parents=True, exist_ok=True)
        for slot in Slot:
            directory = self.slot_dir(slot)
            directory.mkdir(exist_ok=True)
            for entry in directory.iterdir():
                if entry.name.startswith("."):
                    shutil.rmtree(entry, ignore_errors=True)

    def free_bytes(self) -> int | None:
        """Bytes the staging volume has left (None when it cannot be asked)."""
        try:
            stats = os.statvfs(self.root)
        except OSError:
            return None
        return stats.f_bavail * stats.f_frsize

    def fetch_dir(self, identity: Identity) -> Path:
        return self.root / FETCH / identity

    def partial_dir(self, identity: Identity) -> Path:
        """Where downloads of ``identity`` keep their partial files."""
        return self.root / PARTIAL / identity

    def slot_dir(self, slot: Slot) -> Path:
        return self.root / BUFFERS / slot.value

    def snapshot_dir(self, slot: Slot, identity: Identity) -> Path:
        """Where the verified rebuild of ``identity`` in ``slot`` lives on this host."""
        return self.slot_dir(slot) / identity

    @staticmethod
    def engine_path(slot: Slot, identity: Identity) -> Path:
        """The path the engine is handed: under the staging *mount path*, not this host's.
        Every snapshot gets its own path (vLLM may serve stale weights when one path is
        reloaded with other content)."""
        return Path(PurePosixPath(STAGING_MOUNT_PATH) / BUFFERS / slot.value / identity)

    @staticmethod
    def engine_fetch_path(identity: Identity) -> Path:
        """The path of a fetched, verified delta as an engine that patches in place is
        handed it (under the staging mount path). The engine runs one load or patch at a
        time, and a download is removed only after the engine answered that patch (or a
        later load): nothing it reads is changed under it."""
        return Path(PurePosixPath(STAGING_MOUNT_PATH) / FETCH / identity)

    # --- what the buffers hold ------------------------------------------------------------

    def held(self, slot: Slot) -> Staged | None:
        """The verified rebuild in ``slot`` (the newest if a crash left two), or None."""
        directory = self.slot_dir(slot)
        if not directory.is_dir():
            return None
        found = [
            staged
            for entry in sorted(directory.iterdir())
            if entry.is_dir()
            and not entry.name.startswith(".")
            and (staged := read_record(entry)) is not None
        ]
        return max(found, key=lambda s: s.step) if found else None

    def roles(self) -> BufferRoles:
        state = _read_json(self.root / STATE_FILE, _STATE_LIMIT) or {}

        def slot(value: object) -> Slot | None:
            try:
                return Slot(value) if isinstance(value, str) else None
            except ValueError:
                return None

        return BufferRoles(served=slot(state.get("served")), handed=slot(state.get("handed")))

    def buffers(self) -> Buffers:
        """Both buffers' contents and roles, as the planner sees them."""
        roles = self.roles()
        return Buffers(
            {slot: self.held(slot) for slot in Slot}, served=roles.served, handed=roles.handed
        )

    def set_roles(self, served: Slot | None, handed: Slot | None) -> None:
        """Record the roles durably (temp file, fsync, rename, fsync of the directory):
        written *before* a buffer is handed, so a crash never forgets one in use."""
        body = json.dumps(
            {"served": served.value if served else None, "handed": handed.value if handed else None}
        ).encode()
        write_whole(self.root / STATE_FILE, body)
        dir_fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def verify(self, slot: Slot, staged: Staged) -> None:
        """Hash every tensor of a buffer and compare with its record (before handing a
        buffer that was not just rebuilt: a file edited under us is caught here)."""
        directory = self.snapshot_dir(slot, staged.identity)
        try:
            found = directory_digest(directory)
        except (OSError, HotloadError, ValueError) as err:
            raise ChecksumMismatch(
                "a staged rebuild cannot be read back",
                snapshot=staged.identity,
                buffer=slot.value,
                error=str(err),
            ) from err
        if found != staged.digest:
            raise ChecksumMismatch(
                "a staged rebuild's tensors changed since it was verified",
                snapshot=staged.identity,
                buffer=slot.value,
                expected=staged.digest,
                found=found,
            )

    # --- writing (free buffers only) ------------------------------------------------------

    def clear_slot(self, slot: Slot, *, keep: str | None = None) -> None:
        """Empty a buffer (it must be free), keeping the rebuild of ``keep`` if there."""
        directory = self.slot_dir(slot)
        directory.mkdir(parents=True, exist_ok=True)
        for entry in directory.iterdir():
            if entry.name != keep:
                shutil.rmtree(entry, ignore_errors=True)

    def drop_fetched(self, identities: set[Identity]) -> None:
        """Forget downloads (their files are fetched again): after a chain-breaking
        failure, to tell a bad bucket from a bad copy here."""
        for identity in identities:
            shutil.rmtree(self.fetch_dir(identity), ignore_errors=True)
            shutil.rmtree(self.partial_dir(identity), ignore_errors=True)

    def clean_fetches(self, keep: set[str]) -> list[str]:
        """Remove every download not kept (complete or partial); the names removed."""
        removed: list[str] = []
        for area in (FETCH, PARTIAL):
            directory = self.root / area
            if not directory.is_dir():
                continue
            for entry in sorted(directory.iterdir()):
                if entry.name not in keep:
                    shutil.rmtree(entry, ignore_errors=True)
                    removed.append(f"{area}/{entry.name}")
        if removed:
            log.info("staging cleaned", extra={"removed": removed})
        return removed

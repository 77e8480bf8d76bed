"""The delta files of a snapshot, mapped once and read by range.

Payloads are read as memoryviews straight out of the mapping, so decoding a tensor
costs no copy of its encoded bytes and no open or path resolution per tensor.
"""

from __future__ import annotations

from contextlib import ExitStack, suppress
from pathlib import Path

from hotload.errors import DecodeFailed
from hotload.snapshot.manifest import ByteRange, Manifest
from hotload.snapshot.mapping import mapped
from hotload.snapshot.paths import inside


class DeltaFiles:
    """Every delta file of ``manifest`` under ``snapshot``, mapped read-only in ``stack``."""

    def __init__(self, snapshot: Path, manifest: Manifest, stack: ExitStack) -> None:
        self._views: dict[str, memoryview] = {}
        for entry in manifest.deltas:
            if entry.size == 0:
                self._views[entry.path] = memoryview(b"")
                continue
            handle = stack.enter_context(inside(snapshot, entry.path).open("rb"))
            mapping = stack.enter_context(mapped(handle.fileno(), 0))
            view = memoryview(mapping)
            stack.callback(_release, view)
            self._views[entry.path] = view

    def read(self, byte_range: ByteRange) -> memoryview:
        """The bytes of ``byte_range``; DecodeFailed if the file is shorter than it says."""
        view = self._views.get(byte_range.file)
        end = byte_range.offset + byte_range.length
        if view is None or end > len(view):
            raise DecodeFailed("a payload lies outside its delta file", file=byte_range.file)
        return view[byte_range.offset : end]


def _release(view: memoryview) -> None:
    with suppress(BufferError):
        view.release()

"""mmap with a close that tolerates live numpy views.

numpy arrays viewing a mapping keep it "exported"; ``mmap.close`` then raises
``BufferError``. On an error path the traceback can hold such views for a while, and
the ``BufferError`` would replace the real error. These helpers close when they can
and otherwise leave the mapping to be unmapped when its last view is collected.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from contextlib import contextmanager, suppress


@contextmanager
def mapped(fileno: int, length: int, *, writable: bool = False) -> Iterator[mmap.mmap]:
    access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
    mapping = mmap.mmap(fileno, length, access=access)
    try:
        yield mapping
    finally:
        with suppress(BufferError):
            mapping.close()

"""Room on the volume we write: claim a file's bytes before filling it.

The sidecar writes into the pod's staging ``emptyDir``, a tmpfs when its medium is
Memory, sized by its ``sizeLimit`` or by the pod's memory. A file grown by ``ftruncate``
is sparse: its bytes are claimed only when written, so a full volume fails a download in
its middle (``ENOSPC`` after most of the object was read) and a file written through a
memory map (the decoder's shards) with ``SIGBUS``, which kills the process. Reserving
the bytes first (``posix_fallocate``) turns both into an ``ENOSPC`` at the start, which
the caller maps to :class:`hotload.errors.DiskFull`.
"""

from __future__ import annotations

import logging
import os

from hotload.errors import resource_exhausted

log = logging.getLogger(__name__)


def reserve(fd: int, size: int) -> None:
    """Allocate the first ``size`` bytes of the open file ``fd`` on its volume now.

    Raises ``OSError`` (``ENOSPC``, ``EDQUOT``) when there is no room; a file system that
    cannot preallocate (``EOPNOTSUPP``, ``EINVAL``) is left to fail at the write."""
    if size <= 0:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        if resource_exhausted(err) is not None:
            raise
        log.debug("cannot preallocate", extra={"size": size, "error": str(err)})

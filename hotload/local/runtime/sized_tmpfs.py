"""A Memory ``emptyDir`` with a ``sizeLimit``: its own tmpfs of that size, as the kubelet
mounts one, so a full staging volume fails writes with ``ENOSPC`` locally too.

The kubelet backs ``emptyDir: {medium: Memory, sizeLimit: X}`` with a tmpfs of size X;
without a limit, with one sized by the pod's memory. Locally a Memory emptyDir is a
folder under ``/dev/shm`` (the host's tmpfs, shared by every pod); when the volume names
a ``sizeLimit`` and this process may mount (root), the folder becomes a tmpfs of that
size. Without root the limit is not enforced (logged once per volume) and the folder
stays on ``/dev/shm``. Every such mount is unmounted before its folder is removed.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from decimal import Decimal
from pathlib import Path
from typing import Final

from hotload.errors import ContainerConfigInvalid

log = logging.getLogger(__name__)

_QUANTITY: Final = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([KMGTPE]i?|k|m)?$")
_FACTORS: Final = {
    None: 1,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def quantity_bytes(value: object) -> int:
    """A Kubernetes resource quantity of bytes (``64Mi``, ``3M``, ``1500000``) as an int."""
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if match is None or match.group(2) == "m":
        raise ContainerConfigInvalid("a sizeLimit is not a quantity of bytes", sizeLimit=text)
    number, suffix = match.groups()
    return int(Decimal(number) * _FACTORS[suffix])


def can_mount() -> bool:
    return os.geteuid() == 0


def mount_sized(folder: Path, size: int) -> bool:
    """Make ``folder`` a tmpfs of ``size`` bytes (once); False where this process may not."""
    if os.path.ismount(folder):
        return True
    if not can_mount():
        log.warning(
            "a Memory emptyDir's sizeLimit is not enforced locally without root",
            extra={"folder": str(folder), "size": size},
        )
        return False
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0777", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise ContainerConfigInvalid(
            "cannot mount a tmpfs for a sized Memory emptyDir",
            folder=str(folder),
            error=done.stderr.strip(),
        )
    log.info("sized tmpfs mounted", extra={"folder": str(folder), "size": size})
    return True


def unmount_under(directory: Path) -> None:
    """Unmount every mount at or below ``directory`` (deepest first; lazily, so a process
    still holding a file there does not keep the folder from going)."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return
    root = str(directory.absolute())
    points = []
    for line in lines:
        fields = line.split()
        if len(fields) > 1:
            point = fields[1].replace("\\040", " ")
            if point == root or point.startswith(root + "/"):
                points.append(point)
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)

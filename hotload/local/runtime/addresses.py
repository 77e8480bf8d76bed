"""Pod IPs for the runtime's pods: loopback addresses of the region's own range.

Region i owns ``127.i.0.0/16``; kwok hands out its first /24 (``127.i.0.0/24``) to the
fake pods it runs, the runtime the rest, so the two never collide (CONTRACTS.md). Every
pod gets its own address, so its servers listen on their declared ports unchanged
(Linux routes all of 127.0.0.0/8 to the loopback interface; nothing to configure).
Addresses ending in .0 or .255 are skipped so no one mistakes them for a network or a
broadcast address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

from hotload.errors import ConfigError, LocalRegionError


class AddressPool:
    """Allocates one address per pod (by uid) from ``127.i.1.1`` upward, lowest free first."""

    def __init__(self, index: int) -> None:
        if not 1 <= index <= 255:
            raise ConfigError("a region's address index must be 1..255", index=index)
        self.index = index
        self.network = ipaddress.IPv4Network(f"127.{index}.0.0/16")
        self._by_uid: dict[str, str] = {}
        self._taken: set[str] = set()

    def _candidates(self) -> Iterator[str]:
        for third in range(1, 256):
            for fourth in range(1, 255):
                yield f"127.{self.index}.{third}.{fourth}"

    def owns(self, address: str) -> bool:
        """True for an address the runtime may hand out (in range, past kwok's /24)."""
        try:
            ip = ipaddress.IPv4Address(address)
        except ValueError:
            return False
        parts = address.split(".")
        return ip in self.network and parts[2] != "0" and parts[3] not in ("0", "255")

    def reserve(self, uid: str, address: str) -> bool:
        """Keep ``address`` for pod ``uid`` (a restarted runtime keeps each pod's IP)."""
        if not self.owns(address):
            return False
        holder = next((u for u, a in self._by_uid.items() if a == address), None)
        if holder is not None and holder != uid:
            return False
        self.release(uid)
        self._by_uid[uid] = address
        self._taken.add(address)
        return True

    def allocate(self, uid: str) -> str:
        """The pod's address: the one it holds, else the lowest free one."""
        held = self._by_uid.get(uid)
        if held is not None:
            return held
        for candidate in self._candidates():
            if candidate not in self._taken:
                self._by_uid[uid] = candidate
                self._taken.add(candidate)
                return candidate
        raise LocalRegionError("the region's pod address range is exhausted", index=self.index)

    def release(self, uid: str) -> None:
        address = self._by_uid.pop(uid, None)
        if address is not None:
            self._taken.discard(address)

    def address_of(self, uid: str) -> str | None:
        return self._by_uid.get(uid)

    def __len__(self) -> int:
        return len(self._by_uid)

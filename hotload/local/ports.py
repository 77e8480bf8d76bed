"""Loopback ports: pick free ones, and tell whether anything still listens on one."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable

from hotload.errors import LocalRegionError
from hotload.waiting import wait_until

LOOPBACK = "127.0.0.1"

_handed_out: set[int] = set()
_lock = threading.Lock()


def free_port(host: str = LOOPBACK) -> int:
    """A port nothing listens on now, never the same one twice in this process.

    The kernel picks it (bind to 0); remembering what we handed out keeps two regions
    started side by side from being given the same port before either binds it.
    """
    with _lock:
        for _ in range(64):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
                port = int(sock.getsockname()[1])
            if port not in _handed_out:
                _handed_out.add(port)
                return port
    raise LocalRegionError("could not find a free loopback port", host=host)


def is_listening(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_ports_free(ports: Iterable[int], deadline_s: float, host: str = LOOPBACK) -> list[int]:
    """Wait until nothing listens on any of ``ports``; return those still taken at the deadline."""
    pending = sorted(set(ports))

    def all_free() -> bool:
        nonlocal pending
        pending = [port for port in pending if is_listening(port, host)]
        return not pending

    wait_until(all_free, deadline_s, interval_s=0.1)
    return pending

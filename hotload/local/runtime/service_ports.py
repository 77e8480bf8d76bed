"""The region's Service ports: one proxy per service port, kept stable, in services.json.

``services.json`` (in the region directory; CONTRACTS.md) maps
``"<namespace>/<service>"`` to ``{"<port name or number>": <local port>}``. Ports are
chosen once and kept across runtime restarts when still free (every port ever chosen is
remembered in ``runtime/service-ports.json``), so a demo's client keeps its URL. The
file is rewritten atomically whenever a Service appears or goes, and emptied when the
runtime stops (nothing listens then).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from hotload.local.runtime.atomic_files import atomic_write_json
from hotload.local.runtime.service_proxy import ServiceListener, bind_socket
from hotload.local.runtime.service_table import Backend, LocalService, backend_port, parse_service

log = logging.getLogger(__name__)


class RoutedPod(Protocol):
    """What the proxy needs of a pod the runtime runs (a :class:`PodWorker` is one)."""

    key: str
    namespace: str
    ip: str

    def ready(self) -> bool: ...

    def labels(self) -> Mapping[str, str]: ...

    def container_ports(self) -> list[Mapping[str, Any]]: ...


def read_ports(path: Path) -> dict[str, dict[str, int]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        str(service): {str(k): int(v) for k, v in ports.items()}
        for service, ports in data.items()
        if isinstance(ports, dict)
    }


class ServicePorts:
    """Every proxied Service of the region, fed by the Service watch."""

    def __init__(
        self, services_file: Path, memory_file: Path, pods: Callable[[], Iterable[RoutedPod]]
    ) -> None:
        self._file = services_file
        self._memory_file = memory_file
        self._pods = pods
        self._remembered = read_ports(memory_file)
        self._services: dict[str, LocalService] = {}
        self._listeners: dict[tuple[str, str], ServiceListener] = {}
        self._backends: dict[tuple[str, str], list[Backend]] = {}
        self._stale = True
        self._pending: set[str] = set()
        self._written: dict[str, dict[str, int]] | None = None

    # --- pods ---------------------------------------------------------------------------

    def pods_changed(self) -> None:
        """A pod appeared, went, or changed readiness or labels: recompute lazily."""
        self._stale = True

    def backends(self, service: str, port_key: str) -> Sequence[Backend]:
        if self._stale:
            self._recompute()
        return self._backends.get((service, port_key), [])

    def _recompute(self) -> None:
        self._stale = False
        table: dict[tuple[str, str], list[Backend]] = {}
        pods = [pod for pod in self._pods() if pod.ready()]
        for service in self._services.values():
            members = [p for p in pods if service.selects(p.namespace, p.labels())]
            for port in service.ports:
                entries = []
                for pod in members:
                    number = backend_port(port, pod.container_ports())
                    if number:
                        entries.append(Backend(pod.key, pod.ip, number))
                table[(service.key, port.key)] = entries
        self._backends = table

    # --- services -------------------------------------------------------------------------

    def replace_all(self, objects: list[dict[str, Any]]) -> set[str]:
        """A fresh list of Services: returns the keys whose listeners must be reconciled."""
        parsed = {s.key: s for s in (parse_service(o) for o in objects) if s is not None}
        changed = set(self._services) | set(parsed)
        self._services = parsed
        self._stale = True
        return changed

    def apply_event(self, kind: str, obj: Mapping[str, Any]) -> set[str]:
        metadata = obj.get("metadata") or {}
        key = f"{metadata.get('namespace', 'default')}/{metadata.get('name')}"
        service = None if kind == "DELETED" else parse_service(obj)
        if service is None:
            self._services.pop(key, None)
        else:
            self._services[key] = service
        self._stale = True
        return {key}

    async def reconcile(self, keys: Iterable[str]) -> None:
        """Open, keep or close the listeners of ``keys``; rewrite services.json if it moved."""
        for key in keys:
            service = self._services.get(key)
            wanted = {p.key for p in service.ports} if service else set()
            for (svc, port_key), listener in list(self._listeners.items()):
                if svc == key and port_key not in wanted:
                    del self._listeners[(svc, port_key)]
                    await listener.close()
            for port_key in sorted(wanted):
                if (key, port_key) not in self._listeners:
                    await self._open(key, port_key)
        self._write()

    async def _open(self, service: str, port_key: str) -> None:
        previous = self._remembered.get(service, {}).get(port_key)
        sock = None
        if previous:
            try:
                sock = bind_socket(previous)
            except OSError:
                log.info(
                    "previous service port is taken; choosing another",
                    extra={"service": service, "port": previous},
                )
        if sock is None:
            sock = bind_socket(0)
        listener = ServiceListener(
            service, port_key, sock, lambda: self.backends(service, port_key)
        )
        await listener.start()
        self._listeners[(service, port_key)] = listener
        self._remembered.setdefault(service, {})[port_key] = listener.port
        atomic_write_json(self._memory_file, self._remembered)
        log.info(
            "service port open",
            extra={"service": service, "service_port": port_key, "local_port": listener.port},
        )

    def ports(self) -> dict[str, dict[str, int]]:
        table: dict[str, dict[str, int]] = {}
        for (service, port_key), listener in sorted(self._listeners.items()):
            table.setdefault(service, {})[port_key] = listener.port
        return table

    def _write(self) -> None:
        table = self.ports()
        if table != self._written:
            atomic_write_json(self._file, table)
            self._written = table

    async def close(self) -> None:
        listeners = list(self._listeners.values())
        self._listeners.clear()
        for listener in listeners:
            await listener.close()
        atomic_write_json(self._file, {})

"""Services as the runtime's kube-proxy sees them (pure).

EndpointSlices refuse loopback addresses, so the runtime routes from pod readiness
itself: a Service with a selector gets one local port per service port, and its
backends are the runtime's Ready pods in its namespace whose labels match, at the
service port's ``targetPort`` (a number, or a container port's name). Services without
a selector (``kubernetes``, hand-made Endpoints) and ``ExternalName`` ones are not
proxied; only TCP ports are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hotload.local.runtime.probes import resolve_port


@dataclass(frozen=True)
class ServicePort:
    key: str
    """How ``services.json`` names it: the port's name, else its number."""
    port: int
    target: int | str


@dataclass(frozen=True)
class LocalService:
    namespace: str
    name: str
    selector: tuple[tuple[str, str], ...]
    ports: tuple[ServicePort, ...]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        return namespace == self.namespace and all(labels.get(k) == v for k, v in self.selector)


@dataclass(frozen=True)
class Backend:
    pod: str
    """``namespace/name``."""
    ip: str
    port: int


def parse_service(obj: Mapping[str, Any]) -> LocalService | None:
    spec = obj.get("spec") or {}
    selector = spec.get("selector") or {}
    if not selector or spec.get("type") == "ExternalName":
        return None
    ports = tuple(
        ServicePort(
            key=str(p.get("name") or p["port"]),
            port=int(p["port"]),
            target=p.get("targetPort", p["port"]),
        )
        for p in spec.get("ports") or []
        if p.get("protocol", "TCP") == "TCP"
    )
    metadata = obj["metadata"]
    return LocalService(
        namespace=str(metadata.get("namespace", "default")),
        name=str(metadata["name"]),
        selector=tuple(sorted((str(k), str(v)) for k, v in selector.items())),
        ports=ports,
    )


def backend_port(port: ServicePort, container_ports: Sequence[Mapping[str, Any]]) -> int:
    """The pod's port for a service port (0 when a named target is not declared)."""
    return resolve_port(port.target, container_ports)

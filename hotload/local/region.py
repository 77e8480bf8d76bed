"""One local region: its name, its index (and so its address range), where its files
are, and the loopback ports its control plane listens on.

This is what ``up`` plans, writes into ``regions.json`` and hands to callers; tests,
the demo and the pod runtime read every path and address from here, never by
convention of their own.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Final

from pydantic import BaseModel, ConfigDict

from hotload.errors import ConfigError
from hotload.local.certificates import RegionCertificates

#: Region names become kubeconfig contexts, node names and label values.
NAME_PATTERN: Final = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
MIN_INDEX: Final = 1
MAX_INDEX: Final = 255


class RegionPorts(BaseModel):
    """Loopback ports of one region's control plane (all on 127.0.0.1)."""

    model_config = ConfigDict(frozen=True)

    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    """Its secure port, for /healthz."""
    scheduler: int
    kwok: int
    minio: int | None = None
    """The region's S3 endpoint (object storage add-on)."""
    minio_console: int | None = None
    wan: int | None = None
    """The WAN link's listener: the region's S3 endpoint as the world outside reaches it."""
    wan_api: int | None = None
    """toxiproxy's API (and its /metrics: bytes over the link)."""
    prometheus: int | None = None

    def all(self) -> tuple[int, ...]:
        ports = (
            self.etcd_client,
            self.etcd_peer,
            self.apiserver,
            self.controller_manager,
            self.scheduler,
            self.kwok,
            self.minio,
            self.minio_console,
            self.wan,
            self.wan_api,
            self.prometheus,
        )
        return tuple(port for port in ports if port is not None)


class WanLink(BaseModel):
    """The emulated link between the world outside a region and its bucket."""

    model_config = ConfigDict(frozen=True)

    rate_kb_s: int = 0
    """Bandwidth in KB/s, each direction (0: unlimited)."""
    latency_ms: int = 0
    """Added one-way latency."""


class RegionAddons(BaseModel):
    """Optional parts of a region, beyond its control plane and pod runtime."""

    model_config = ConfigDict(frozen=True)

    object_storage: bool = False
    """A MinIO with the region's bucket, behind an emulated WAN link (toxiproxy)."""
    wan: WanLink = WanLink()
    replication: bool = True
    """With object storage in several regions: MinIO bucket replication between them."""
    prometheus: bool = False
    """A Prometheus scraping the region's operators and sidecars."""


class Region(BaseModel):
    """A local region: a real control plane on loopback with fake GPU nodes."""

    model_config = ConfigDict(frozen=True)

    name: str
    """Also its kubeconfig context, and the value of its nodes' region label."""
    index: int
    """The region owns 127.<index>.0.0/16."""
    directory: Path
    """``<state>/<name>/``: etcd data, certificates, logs, pid files, services.json."""
    kubeconfig: Path
    """The state's kubeconfig, with one context per region."""
    ports: RegionPorts
    nodes: int
    gpus_per_node: int
    addons: RegionAddons = RegionAddons()

    @property
    def context(self) -> str:
        return self.name

    @property
    def apiserver_url(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def admin_kubeconfig(self) -> Path:
        """A kubeconfig for this region alone (what its components use)."""
        return self.directory / "admin.kubeconfig"

    @property
    def certificates(self) -> RegionCertificates:
        return RegionCertificates(self.directory / "certs")

    @property
    def services_file(self) -> Path:
        """Local port of each Service (written by the pod runtime; ``{}`` at first)."""
        return self.directory / "services.json"

    @property
    def etcd_data(self) -> Path:
        return self.directory / "etcd"

    @property
    def logs_dir(self) -> Path:
        return self.directory / "logs"

    @property
    def pids_dir(self) -> Path:
        return self.directory / "pids"

    @property
    def kwok_stages(self) -> Path:
        return self.directory / "kwok-stages.yaml"

    @property
    def pod_network(self) -> ipaddress.IPv4Network:
        """Every pod address of this region: 127.<index>.0.0/16."""
        return ipaddress.IPv4Network(f"127.{self.index}.0.0/16")

    @property
    def kwok_network(self) -> ipaddress.IPv4Network:
        """kwok's share (its fake pods): the first /24. The pod runtime uses the rest."""
        return ipaddress.IPv4Network(f"127.{self.index}.0.0/24")

    def node_names(self) -> list[str]:
        return [f"{self.name}-gpu-{number}" for number in range(self.nodes)]


def validate_name(name: str) -> str:
    if not NAME_PATTERN.match(name):
        raise ConfigError(
            "a region name is a DNS label: lowercase letters, digits and '-', "
            "starting with a letter, at most 40 characters",
            name=name,
        )
    return name


def validate_index(index: int) -> int:
    if not MIN_INDEX <= index <= MAX_INDEX:
        raise ConfigError(
            f"a region index must be within {MIN_INDEX}..{MAX_INDEX} (it is the second octet "
            "of the region's 127.i.0.0/16)",
            index=index,
        )
    return index


def default_names(count: int) -> list[str]:
    """``region-1`` … ``region-N``."""
    if count < 1:
        raise ConfigError("at least one region is needed", regions=count)
    return [f"region-{number}" for number in range(1, count + 1)]

"""The emulated WAN link into a region: a toxiproxy in front of the region's MinIO.

Everything that reaches a region's bucket from outside the region (the trainer's uploads,
another region's replication) goes through this link, which adds latency and limits
bandwidth (``tc netem`` does not exist here; toxiproxy does both on one TCP hop), and
counts the bytes (toxiproxy's ``-proxy-metrics``): bytes over the WAN per snapshot are
measured, not estimated. toxiproxy counts a connection's bytes when it closes, so a
measurement first closes the link's idle connections (:func:`settle`). The region's own
sidecars read the MinIO directly, as in-region traffic would.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx

from hotload.errors import LocalRegionError
from hotload.local.object_storage import enabled as object_storage_enabled
from hotload.local.processes import ProcessSpec, Wave
from hotload.local.readiness import HttpReady
from hotload.local.region import Region

PROXY: Final = "s3"
API_TIMEOUT_S: Final = 30.0
API_ATTEMPTS: Final = 3
_METRIC: Final = re.compile(
    r"^toxiproxy_proxy_received_bytes_total\{(?P<labels>[^}]*)\}\s+(?P<value>[0-9.e+]+)$"
)


def _ports(region: Region) -> tuple[int, int, int]:
    ports = region.ports
    if ports.wan is None or ports.wan_api is None or ports.minio is None:
        raise LocalRegionError("the region has no WAN link: no object storage", region=region.name)
    return ports.wan, ports.wan_api, ports.minio


def endpoint(region: Region) -> str:
    """The region's S3 endpoint as the world outside reaches it (through the link)."""
    return f"http://127.0.0.1:{_ports(region)[0]}"


def api_url(region: Region) -> str:
    return f"http://127.0.0.1:{_ports(region)[1]}"


def wan_process(region: Region, tools: Mapping[str, Path]) -> ProcessSpec | None:
    if not object_storage_enabled(region):
        return None
    listen, api, _ = _ports(region)
    check = HttpReady(f"http://127.0.0.1:{api}/version")
    return ProcessSpec(
        name="wan",
        argv=(
            str(tools["toxiproxy-server"]),
            "-host",
            "127.0.0.1",
            "-port",
            str(api),
            "-proxy-metrics",
        ),
        wave=Wave.STORAGE,
        ready=check,
        ready_what=check.describe(),
        ports=(api, listen),
    )


def _call(
    region: Region,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    *,
    tolerate: tuple[int, ...] = (),
) -> Any:
    """One call to the proxy's API. Statuses in ``tolerate`` count as success: a retried
    call may find done what an attempt that timed out on our side did (409, 404)."""
    # Patient: on a busy machine (hundreds of sidecars starting) the proxy answers late.
    for attempt in range(API_ATTEMPTS):
        try:
            response = httpx.request(
                method, f"{api_url(region)}{path}", json=body, timeout=API_TIMEOUT_S
            )
            break
        except httpx.HTTPError as err:
            if attempt == API_ATTEMPTS - 1:
                raise LocalRegionError(
                    "the WAN proxy did not answer", region=region.name, request=f"{method} {path}"
                ) from err
    if response.status_code in tolerate:
        return None
    if response.status_code >= 300:
        raise LocalRegionError(
            "the WAN proxy refused a change",
            region=region.name,
            request=f"{method} {path}",
            answer=response.text[:300],
        )
    return response.json() if response.content else None


def configure(region: Region) -> None:
    """Open the link (the proxy to the region's MinIO) with the region's latency and rate."""
    listen, _, minio = _ports(region)
    existing = _call(region, "GET", "/proxies") or {}
    if PROXY not in existing:
        _call(
            region,
            "POST",
            "/proxies",
            {"name": PROXY, "listen": f"127.0.0.1:{listen}", "upstream": f"127.0.0.1:{minio}"},
        )
    set_link(region, region.addons.wan.rate_kb_s, region.addons.wan.latency_ms)


def set_link(region: Region, rate_kb_s: int, latency_ms: int) -> None:
    """Change the link's bandwidth (KB/s each way, 0: unlimited) and one-way latency (ms)."""
    toxics = {toxic["name"] for toxic in _call(region, "GET", f"/proxies/{PROXY}/toxics") or []}
    for stream in ("upstream", "downstream"):
        for kind, value, attribute in (
            ("bandwidth", rate_kb_s, "rate"),
            ("latency", latency_ms, "latency"),
        ):
            name = f"{kind}-{stream}"
            if name in toxics:
                _call(region, "DELETE", f"/proxies/{PROXY}/toxics/{name}", tolerate=(404,))
            if value > 0:
                _call(
                    region,
                    "POST",
                    f"/proxies/{PROXY}/toxics",
                    {
                        "name": name,
                        "type": kind,
                        "stream": stream,
                        "attributes": {attribute: value},
                    },
                    tolerate=(409,),
                )


@dataclass(frozen=True)
class WanBytes:
    """Bytes that crossed a region's link since it started."""

    inbound: int
    """Into the region (uploads, replication pushes)."""
    outbound: int
    """Out of it (answers, downloads from outside)."""

    def __sub__(self, other: WanBytes) -> WanBytes:
        return WanBytes(self.inbound - other.inbound, self.outbound - other.outbound)


def settle(region: Region) -> None:
    """Close the link's open connections so their bytes are counted (toxiproxy counts a
    connection's bytes when it ends; clients and MinIO's replication keep theirs open).
    Call it where nothing is in flight: a transfer running now would be cut (and retried)."""
    for enabled in (False, True):
        set_enabled(region, enabled)


def set_enabled(region: Region, enabled: bool) -> None:
    """Open or cut the region's link (cut: new connections are refused, open ones closed)."""
    _call(region, "POST", f"/proxies/{PROXY}", {"enabled": enabled})


def bytes_over(region: Region, *, settled: bool = True) -> WanBytes:
    """What toxiproxy counted on the region's link (after :func:`settle`, unless told not to)."""
    if settled:
        settle(region)
    try:
        text = httpx.get(f"{api_url(region)}/metrics", timeout=API_TIMEOUT_S).text
    except httpx.HTTPError as err:
        raise LocalRegionError("the WAN proxy did not answer", region=region.name) from err
    return parse_metrics(text)


def parse_metrics(text: str) -> WanBytes:
    """The link's byte counters from toxiproxy's Prometheus text (``upstream`` is what
    clients sent through it: into the region)."""
    inbound = outbound = 0
    for line in text.splitlines():
        match = _METRIC.match(line)
        if match is None or f'proxy="{PROXY}"' not in match["labels"]:
            continue
        value = int(float(match["value"]))
        if 'direction="upstream"' in match["labels"]:
            inbound += value
        elif 'direction="downstream"' in match["labels"]:
            outbound += value
    return WanBytes(inbound, outbound)

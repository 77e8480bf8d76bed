"""A Prometheus per region (the ``--prometheus`` add-on), as a cluster would run its own.

It discovers the region's pods through the apiserver (``kubernetes_sd``, role ``pod``:
EndpointSlices refuse loopback addresses, pods do not) and scrapes the sidecars of every
RolloutDeployment and the chart's operator pods (``/metrics`` on their ``http`` ports),
adding ``region``, ``namespace``, ``pod`` and ``deployment`` labels, and evaluates
hotload's recording rules (freshness lag in steps, propagation time). The binary is built
from its module source by ``hack/build-tools prometheus``.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Final

import httpx
import yaml

from hotload.api.labels import PART_OF, REPLICA_NAME
from hotload.errors import LocalRegionError
from hotload.local.processes import ProcessSpec, Wave
from hotload.local.readiness import HttpReady
from hotload.local.region import Region

RULES_FILE: Final = "prometheus-rules.yaml"
SCRAPE_INTERVAL: Final = "5s"
#: The chart labels its operator pods app.kubernetes.io/component=operator and part-of=hotload.
OPERATOR_COMPONENT: Final = "operator"
POD_LABEL: Final = "__meta_kubernetes_pod_label_"


def enabled(region: Region) -> bool:
    return region.addons.prometheus


def url(region: Region) -> str:
    if region.ports.prometheus is None:
        raise LocalRegionError("the region runs no Prometheus", region=region.name)
    return f"http://127.0.0.1:{region.ports.prometheus}"


def query(region: Region, promql: str) -> list[dict[str, Any]]:
    """An instant query against the region's Prometheus: its result vector."""
    try:
        response = httpx.get(f"{url(region)}/api/v1/query", params={"query": promql}, timeout=10)
        response.raise_for_status()
    except httpx.HTTPError as err:
        raise LocalRegionError(
            "the region's Prometheus did not answer", region=region.name, query=promql
        ) from err
    body = response.json()
    if body.get("status") != "success":
        raise LocalRegionError(
            "the region's Prometheus refused a query", region=region.name, query=promql
        )
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def rules_text() -> str:
    """hotload's recording rules (package data; the chart ships the same file)."""
    return resources.files("hotload.local").joinpath(RULES_FILE).read_text()


def directory(region: Region) -> Path:
    return region.directory / "prometheus"


def _common_labels(region: Region) -> list[dict[str, Any]]:
    return [
        {"target_label": "region", "replacement": region.name},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
    ]


def _keep(label: str, value: str) -> dict[str, Any]:
    return {"source_labels": [label], "regex": value, "action": "keep"}


def scrape_config(region: Region) -> dict[str, Any]:
    """The region's prometheus.yml."""
    discovery = [{"role": "pod", "kubeconfig_file": str(region.admin_kubeconfig)}]
    return {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
        "rule_files": [str(directory(region) / RULES_FILE)],
        "scrape_configs": [
            {
                "job_name": "hotload-sidecar",
                "kubernetes_sd_configs": discovery,
                "relabel_configs": [
                    _keep(f"{POD_LABEL}app_kubernetes_io_name", REPLICA_NAME),
                    _keep("__meta_kubernetes_pod_container_port_name", "http"),
                    _keep("__meta_kubernetes_pod_phase", "Running"),
                    *_common_labels(region),
                    {
                        "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
                        "target_label": "deployment",
                    },
                ],
            },
            {
                "job_name": "hotload-operator",
                # The operator's metrics carry their own namespace/deployment labels.
                "honor_labels": True,
                "kubernetes_sd_configs": discovery,
                "relabel_configs": [
                    _keep(f"{POD_LABEL}app_kubernetes_io_part_of", PART_OF),
                    _keep(f"{POD_LABEL}app_kubernetes_io_component", OPERATOR_COMPONENT),
                    _keep("__meta_kubernetes_pod_container_port_name", "http"),
                    _keep("__meta_kubernetes_pod_phase", "Running"),
                    {"target_label": "region", "replacement": region.name},
                    {
                        "source_labels": ["__meta_kubernetes_pod_name"],
                        "target_label": "operator_pod",
                    },
                ],
            },
        ],
    }


def write_config(region: Region) -> Path:
    """prometheus.yml and the rules file in the region's prometheus directory."""
    where = directory(region)
    where.mkdir(parents=True, exist_ok=True)
    (where / RULES_FILE).write_text(rules_text())
    path = where / "prometheus.yml"
    path.write_text(yaml.safe_dump(scrape_config(region), sort_keys=False))
    return path


def prometheus_process(region: Region, tools: Mapping[str, Path]) -> ProcessSpec | None:
    if not enabled(region) or region.ports.prometheus is None:
        return None
    port = region.ports.prometheus
    check = HttpReady(f"http://127.0.0.1:{port}/-/ready")
    return ProcessSpec(
        name="prometheus",
        argv=(
            str(tools["prometheus"]),
            f"--config.file={directory(region) / 'prometheus.yml'}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--storage.tsdb.path={directory(region) / 'data'}",
            "--storage.tsdb.retention.time=1d",
            "--log.level=warn",
        ),
        wave=Wave.WORKLOADS,
        ready=check,
        ready_what=check.describe(),
        ports=(port,),
        ready_timeout_s=60.0,
    )

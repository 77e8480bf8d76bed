"""Install the hotload chart into local regions with the pinned ``helm``, as a user would.

The chart in the checkout (``charts/hotload``) goes into every region through ``helm upgrade
--install``; the pod runtime then runs the operator Deployment's pods (their command is
``hotload operator …``) with their own pod-bound tokens. Local regions need one value a real
cluster does not: the fake GPU nodes' taint, which the operator's pods must tolerate.

The install returns once helm has applied the release; :func:`wait_operator` waits until
every region's operator Deployment is available, and says what its pods are stuck on when
it is not. The demo and the test fixtures use both; nothing else installs the chart.
"""

from __future__ import annotations

import logging
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from hotload.errors import ChartInstallFailed, LocalRegionError
from hotload.local.bootstrap import FAKE_NODE_TAINT, api_client
from hotload.local.readiness import wait_for
from hotload.local.region import Region
from hotload.local.tools import helm_path
from hotload.local.versions import repo_root

log = logging.getLogger(__name__)

RELEASE: Final = "hotload"
NAMESPACE: Final = "hotload-system"
DEFAULT_OPERATOR_REPLICAS: Final = 2
#: What helm may take to apply a release (it does not wait for pods: see wait_operator).
HELM_TIMEOUT_S: Final = 180.0
#: The fake GPU nodes' taint: every pod that runs in a local region tolerates it.
LOCAL_TOLERATIONS: Final = (
    {"key": FAKE_NODE_TAINT["key"], "operator": "Exists", "effect": FAKE_NODE_TAINT["effect"]},
)


def chart_path() -> Path:
    """``charts/hotload`` of the checkout this package runs from."""
    root = repo_root()
    chart = None if root is None else root / "charts" / "hotload"
    if chart is None or not (chart / "Chart.yaml").is_file():
        raise LocalRegionError(
            "the hotload chart is not reachable: run from a hotload checkout (charts/hotload)",
            looked_in=str(chart),
        )
    return chart


def _merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``extra`` over ``base``, maps merged key by key (as helm merges values files)."""
    merged = dict(base)
    for key, value in extra.items():
        current = merged.get(key)
        if isinstance(current, Mapping) and isinstance(value, Mapping):
            merged[key] = _merge(current, value)
        else:
            merged[key] = value
    return merged


@dataclass(frozen=True)
class ChartRelease:
    """One release of the chart, the same in every region it goes to."""

    release: str = RELEASE
    namespace: str = NAMESPACE
    watch_namespaces: tuple[str, ...] = ()
    """Names (kopf globs too when ``cluster_wide``); empty: the release's namespace, or with
    ``cluster_wide`` every namespace."""
    cluster_wide: bool = False
    """The chart's explicit cluster-wide mode (one ClusterRole; writes in every namespace)."""
    values: Mapping[str, Any] = field(default_factory=dict)
    """More values, merged over the local ones."""

    @property
    def operator_deployment(self) -> str:
        """The Deployment the chart names ``<fullname>-operator`` (fullname, as the chart's
        helper makes it: ``fullnameOverride``, else the release's name when it contains the
        chart's (or ``nameOverride``'s) name, else ``<release>-<name>``)."""
        name = self.values.get("nameOverride") or "hotload"
        fullname = self.values.get("fullnameOverride") or (
            self.release if name in self.release else f"{self.release}-{name}"
        )
        return f"{fullname[:63].rstrip('-')}-operator"[:63].rstrip("-")

    @property
    def operator_replicas(self) -> int:
        """How many operator replicas the release asks for (the chart's default: 2)."""
        operator = self.values.get("operator") or {}
        return int(operator.get("replicas", DEFAULT_OPERATOR_REPLICAS))

    def local_values(self) -> dict[str, Any]:
        """The values for a local region: the fake nodes' toleration, the watched namespaces."""
        local = {
            "watchNamespaces": list(self.watch_namespaces),
            "clusterWide": {"enabled": self.cluster_wide},
            "operator": {"tolerations": [dict(t) for t in LOCAL_TOLERATIONS]},
        }
        return _merge(local, self.values)

    @property
    def role_namespaces(self) -> tuple[str, ...]:
        """The namespaces the chart gives the operator a Role in (none in cluster-wide mode):
        they must exist before the install."""
        if self.cluster_wide:
            return ()
        return self.watch_namespaces or (self.namespace,)


def helm_argv(region: Region, *args: str) -> list[str]:
    """The pinned helm against one region's context."""
    return [
        str(helm_path()),
        "--kubeconfig", str(region.kubeconfig),
        "--kube-context", region.context,
        *args,
    ]  # fmt: skip


def _run_everywhere(
    regions: Sequence[Region], argv_for: Mapping[str, list[str]], what: str, timeout_s: float
) -> None:
    """Run one helm command per region at once; raise for the first region that failed."""
    running = {
        region.name: subprocess.Popen(
            argv_for[region.name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for region in regions
    }
    failures: list[ChartInstallFailed] = []
    for name, process in running.items():
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
            failures.append(
                ChartInstallFailed(f"helm {what} timed out", region=name, timeout_s=timeout_s)
            )
            continue
        if process.returncode != 0:
            failures.append(
                ChartInstallFailed(
                    f"helm {what} failed", region=name, stderr=stderr.strip()[-2000:]
                )
            )
        else:
            log.info("helm %s", what, extra={"region": name, "output": stdout.strip()[-500:]})
    if failures:
        raise failures[0]


def install(
    regions: Sequence[Region],
    chart: ChartRelease | None = None,
    *,
    timeout_s: float = HELM_TIMEOUT_S,
) -> ChartRelease:
    """``helm upgrade --install`` the chart into every region at once (CRDs first, as helm
    does; existing CRDs are left as they are). Returns the release it installed."""
    chart = chart or ChartRelease()
    for region in regions:
        _create_namespaces(region, chart.role_namespaces)
    with tempfile.TemporaryDirectory(prefix="hotload-chart-") as scratch:
        values = Path(scratch) / "values.yaml"
        values.write_text(yaml.safe_dump(chart.local_values(), sort_keys=False))
        command = [
            "upgrade", "--install", chart.release, str(chart_path()),
            "--namespace", chart.namespace, "--create-namespace",
            "--values", str(values),
            "--timeout", f"{int(timeout_s)}s",
        ]  # fmt: skip
        argv = {region.name: helm_argv(region, *command) for region in regions}
        _run_everywhere(regions, argv, "upgrade --install", timeout_s + 30)
    return chart


def _create_namespaces(region: Region, names: Sequence[str]) -> None:
    """``kubectl create namespace`` for each, as a user does before the install (existing
    ones are kept)."""
    if not names:
        return
    with api_client(region) as api:
        core = k8s.CoreV1Api(api)
        for name in names:
            try:
                core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
            except ApiException as err:
                if err.status != 409:
                    raise ChartInstallFailed(
                        "could not create a namespace the operator is to watch",
                        region=region.name,
                        namespace=name,
                        status=err.status,
                    ) from err


def uninstall(
    regions: Sequence[Region], chart: ChartRelease | None = None, *, timeout_s: float = 120.0
) -> None:
    """``helm uninstall`` in every region (helm keeps the CRDs, and so the objects)."""
    chart = chart or ChartRelease()
    command = [
        "uninstall", chart.release, "--namespace", chart.namespace,
        "--wait", "--timeout", f"{int(timeout_s)}s",
    ]  # fmt: skip
    argv = {region.name: helm_argv(region, *command) for region in regions}
    _run_everywhere(regions, argv, "uninstall", timeout_s + 30)


def _deployment_available(apps: k8s.AppsV1Api, chart: ChartRelease) -> bool:
    try:
        deployment = apps.read_namespaced_deployment(chart.operator_deployment, chart.namespace)
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    wanted = deployment.spec.replicas if deployment.spec and deployment.spec.replicas else 1
    generation = deployment.metadata.generation if deployment.metadata else None
    status = deployment.status
    return bool(
        status
        and (status.observed_generation or 0) >= (generation or 0)
        and (status.updated_replicas or 0) == wanted
        and (status.available_replicas or 0) == wanted
        and (status.replicas or 0) == wanted
    )


def _pod_problem(pod: k8s.V1Pod) -> str | None:
    """What a pod that is not Ready waits on (None when it is Ready)."""
    status = pod.status or k8s.V1PodStatus()
    if any(c.type == "Ready" and c.status == "True" for c in status.conditions or []):
        return None
    states = []
    for container in status.container_statuses or []:
        waiting = container.state.waiting if container.state else None
        if waiting is not None:
            states.append(f"{container.name}: {waiting.reason}: {waiting.message or ''}")
        else:
            states.append(f"{container.name}: restarts={container.restart_count}")
    name = pod.metadata.name if pod.metadata else "?"
    return f"{name} ({status.phase}): {'; '.join(states) or 'no container status'}"


def operator_pod_problems(core: k8s.CoreV1Api, chart: ChartRelease) -> list[str]:
    """One line per operator pod that is not Ready: what its containers wait on."""
    selector = f"app.kubernetes.io/instance={chart.release},app.kubernetes.io/component=operator"
    pods = core.list_namespaced_pod(chart.namespace, label_selector=selector).items
    return [problem for pod in pods if (problem := _pod_problem(pod)) is not None]


def wait_operator(
    regions: Sequence[Region], chart: ChartRelease | None = None, *, timeout_s: float = 180.0
) -> None:
    """Wait until the operator Deployment is available in every region (all replicas Ready,
    so their probes answer). On timeout the error names the pods and what they wait on."""
    chart = chart or ChartRelease()
    for region in regions:
        api = api_client(region)
        try:
            apps, core = k8s.AppsV1Api(api), k8s.CoreV1Api(api)

            def available(apps: k8s.AppsV1Api = apps) -> bool:
                return _deployment_available(apps, chart)

            try:
                wait_for(
                    available,
                    f"the hotload operator in {region.name}",
                    timeout_s,
                    interval_s=0.5,
                )
            except LocalRegionError as err:
                raise ChartInstallFailed(
                    "the hotload operator did not become available",
                    region=region.name,
                    deployment=f"{chart.namespace}/{chart.operator_deployment}",
                    pods=" | ".join(operator_pod_problems(core, chart)) or "none",
                    logs=str(region.directory / "runtime" / "pods"),
                ) from err
        finally:
            api.close()  # type: ignore[no-untyped-call]

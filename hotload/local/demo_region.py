"""One region as the demo drives it: kubectl for what a user types, the API for what it reads.

The demo applies objects with the pinned kubectl (server-side apply, as a trainer would) and
reads the operator's answers through the API: a PolicySnapshot's conditions, the deployment's
``Degraded`` condition, the Events the operator emits and what each replica's pod says it
serves. Waits poll with a deadline and fail with what the region shows at that moment.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar, cast

import kubernetes.client
import yaml
from kubernetes.client.exceptions import ApiException

from hotload.api import GROUP, VERSION, PolicySnapshot, RolloutDeployment
from hotload.api import pod as contract
from hotload.api.conditions import Condition, find_condition
from hotload.api.kinds import Identity
from hotload.api.policy_snapshot import PLURAL as SNAPSHOTS
from hotload.api.rollout_deployment import PLURAL as DEPLOYMENTS
from hotload.errors import LocalRegionError
from hotload.kube.client import sync_api_client
from hotload.local.region import Region
from hotload.local.runtime.service_ports import read_ports
from hotload.local.tools import kubectl_path
from hotload.operator.workload import label_selector
from hotload.waiting import wait_until

T = TypeVar("T")

POLL_S: Final = 0.5
FIELD_MANAGER: Final = "hotload-demo"


class RegionSession:
    """The demo's handle on one region and one namespace."""

    def __init__(self, region: Region, namespace: str, deployment: str) -> None:
        self.region = region
        self.namespace = namespace
        self.deployment_name = deployment
        self._api = sync_api_client(region.kubeconfig, context=region.context)
        self.core = kubernetes.client.CoreV1Api(self._api)
        self.custom = kubernetes.client.CustomObjectsApi(self._api)

    @property
    def name(self) -> str:
        return self.region.name

    def close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]

    # --- what a user types ---------------------------------------------------------------

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        command = [
            str(kubectl_path()),
            "--kubeconfig", str(self.region.kubeconfig),
            "--context", self.region.context,
            *args,
        ]  # fmt: skip
        done = subprocess.run(command, input=stdin, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise LocalRegionError(
                "kubectl failed", region=self.name, args=" ".join(args), stderr=done.stderr.strip()
            )
        return done.stdout

    def apply(self, *objects: Mapping[str, Any]) -> None:
        """``kubectl apply --server-side`` of ``objects`` into the namespace."""
        documents = yaml.safe_dump_all([dict(o) for o in objects], sort_keys=False)
        self.kubectl(
            "apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}",
            "-n", self.namespace, "-f", "-",
            stdin=documents,
        )  # fmt: skip

    # --- what the operator and the replicas say --------------------------------------------

    def deployment(self) -> RolloutDeployment | None:
        raw = self._get(DEPLOYMENTS, self.deployment_name)
        return None if raw is None else RolloutDeployment.model_validate(raw)

    def snapshot(self, identity: Identity) -> PolicySnapshot | None:
        raw = self._get(SNAPSHOTS, identity)
        return None if raw is None else PolicySnapshot.model_validate(raw)

    def snapshots(self) -> list[PolicySnapshot]:
        listed = cast(
            dict[str, Any],
            self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, SNAPSHOTS),
        )
        return [PolicySnapshot.model_validate(item) for item in listed["items"]]

    def snapshot_condition(self, identity: Identity, kind: str) -> Condition | None:
        snapshot = self.snapshot(identity)
        if snapshot is None or snapshot.status is None:
            return None
        return find_condition(snapshot.status.conditions, kind)

    def deployment_condition(self, kind: str) -> Condition | None:
        deployment = self.deployment()
        if deployment is None or deployment.status is None:
            return None
        return find_condition(deployment.status.conditions, kind)

    def served(self) -> dict[str, str | None]:
        """Pod name → the snapshot its sidecar says it serves, verified (None: nothing yet)."""
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector=label_selector(self.deployment_name)
        ).items
        served: dict[str, str | None] = {}
        for pod in pods:
            metadata = pod.metadata or kubernetes.client.V1ObjectMeta()
            if metadata.deletion_timestamp is None and metadata.name:
                served[metadata.name] = (metadata.annotations or {}).get(
                    contract.ANNOTATION_SNAPSHOT
                )
        return served

    def events(self, reason: str) -> list[str]:
        """Messages of the Events with ``reason`` about the deployment, oldest first."""
        listed = self.core.list_namespaced_event(
            self.namespace,
            field_selector=f"involvedObject.name={self.deployment_name},reason={reason}",
        ).items
        return [event.message or "" for event in listed]

    def service_port(self) -> int | None:
        """The local port the pod runtime opened for the deployment's Service."""
        ports = read_ports(self.region.services_file)
        return ports.get(f"{self.namespace}/{self.deployment_name}", {}).get("http")

    def _get(self, plural: str, name: str) -> dict[str, Any] | None:
        try:
            found = cast(
                dict[str, Any],
                self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, plural, name
                ),
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return found

    # --- waiting ---------------------------------------------------------------------------

    def wait(
        self,
        what: str,
        probe: Callable[[], T | None],
        timeout_s: float,
        explain: Callable[[], str] | None = None,
    ) -> T:
        """``probe``'s first truthy answer; at the deadline an error naming ``what`` and, when
        given, what ``explain`` says the region shows then."""
        found = wait_until(probe, timeout_s, interval_s=POLL_S)
        if found is None or not found:
            raise LocalRegionError(
                f"timed out waiting for {what}",
                region=self.name,
                timeout_s=timeout_s,
                shows=explain() if explain else "",
            )
        return found

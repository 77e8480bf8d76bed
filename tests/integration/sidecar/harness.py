"""Real replicas for the sidecar's tests: pods of examples/pod.yaml run by the pod runtime.

Each replica is the pod CONTRACTS.md's pod contract describes, run for real by the local
pod runtime (``hotload local runtime``, started with the regions): the real ``hotload
engine reference`` and ``hotload sidecar`` processes on the pod's own 127.i.x.y address,
the sidecar with the pod-bound token of a ServiceAccount whose Role is exactly
``hotload.api.pod.SIDECAR_RBAC_RULES`` (an RBAC gap fails a test), sharing the pod's
staging ``emptyDir``. Until the operator exists, tests create the RolloutDeployment and
move its ``status.targetSnapshot`` themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import signal
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml
from kubernetes import client as k8s

from hotload.api import (
    GROUP,
    VERSION,
    EngineKind,
    SnapshotRef,
    Transition,
)
from hotload.api.pod import (
    CONDITION_SNAPSHOT_READY,
    SIDECAR_PORT,
    SIDECAR_RBAC_RULES,
    STAGING_VOLUME,
)
from hotload.api.rollout_deployment import PLURAL
from hotload.local import Region
from hotload.waiting import wait_until_async

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[3]
ENGINE_PORT = 8000


async def eventually(
    probe: Callable[[], Awaitable[T | None]] | Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.1,
) -> T:
    """Poll ``probe`` until it returns something truthy; fail with ``what`` at the deadline."""

    async def attempt() -> Any:
        result = probe()
        if asyncio.iscoroutine(result):
            result = await result
        return result

    last = await wait_until_async(attempt, timeout, interval_s=interval)
    if last:
        return last  # type: ignore[no-any-return]
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def rollout_deployment(
    name: str,
    bucket_url: str,
    *,
    transition: Transition = Transition.ASYNC,
    max_stale_steps: int | None = None,
    endpoint: str | None = None,
    secret: str | None = None,
    engine: EngineKind = EngineKind.REFERENCE,
) -> dict[str, Any]:
    hot_load: dict[str, Any] = {"bucketUrl": bucket_url, "transition": transition.value}
    if max_stale_steps is not None:
        hot_load["maxStaleSteps"] = max_stale_steps
    if endpoint is not None:
        hot_load["endpoint"] = endpoint
    if secret is not None:
        hot_load["credentialsSecretRef"] = {"name": secret}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RolloutDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "reference-tiny", "servedName": name},
            "engine": {"kind": engine.value, "port": ENGINE_PORT},
            "replicas": 1,
            "hotLoad": hot_load,
        },
    }


@dataclass
class Replica:
    """One pod the runtime runs, and where to reach it."""

    pod: str
    ip: str
    uid: str
    directory: Path
    """The runtime's folder of this pod (volumes, container roots, logs)."""
    env: dict[str, str]
    """The sidecar container's environment (deployment name, ...)."""

    @property
    def front(self) -> str:
        return f"http://{self.ip}:{SIDECAR_PORT}"

    @property
    def engine_url(self) -> str:
        return f"http://{self.ip}:{ENGINE_PORT}"

    @property
    def staging(self) -> Path:
        """The pod's staging ``emptyDir`` on this host."""
        return self.directory / "volumes" / STAGING_VOLUME


@dataclass
class SidecarHarness:
    """Creates replicas in one namespace of one region and stops their processes."""

    api: k8s.ApiClient
    region: Region
    namespace: str
    workdir: Path
    replicas: list[Replica] = field(default_factory=list)

    # --- Kubernetes objects ------------------------------------------------------------

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    @property
    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.api)

    def create_deployment(self, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)

    def set_target(self, deployment: str, target: SnapshotRef) -> None:
        """Move ``status.targetSnapshot`` (the operator's job, done by the test for now)."""
        self.custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
            deployment,
            {"status": {"targetSnapshot": target.to_k8s()}},
        )

    def create_rbac(self, service_account: str) -> None:
        """The sidecar's ServiceAccount, Role (exactly SIDECAR_RBAC_RULES) and binding."""
        rbac = k8s.RbacAuthorizationV1Api(self.api)
        self.core.create_namespaced_service_account(
            self.namespace, {"metadata": {"name": service_account}}
        )
        rbac.create_namespaced_role(
            self.namespace,
            {"metadata": {"name": service_account}, "rules": [dict(r) for r in SIDECAR_RBAC_RULES]},
        )
        rbac.create_namespaced_role_binding(
            self.namespace,
            {
                "metadata": {"name": service_account},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": service_account,
                },
                "subjects": [
                    {"kind": "ServiceAccount", "name": service_account, "namespace": self.namespace}
                ],
            },
        )

    def pod_body(
        self,
        name: str,
        deployment: str,
        service_account: str,
        *,
        sidecar_args: tuple[str, ...] = (),
        engine_args: tuple[str, ...] = ("--threads", "1"),
        secret: str | None = None,
        staging_size_limit: str | None = None,
    ) -> dict[str, Any]:
        """``examples/pod.yaml`` for this replica: its name, deployment, SA and Secret (and
        a ``sizeLimit`` on its staging volume: a tmpfs of that size under the runtime)."""
        pod: dict[str, Any] = copy.deepcopy(
            yaml.safe_load((REPO / "examples/pod.yaml").read_text())
        )
        if staging_size_limit is not None:
            for volume in pod["spec"]["volumes"]:
                if volume["name"] == STAGING_VOLUME:
                    volume["emptyDir"]["sizeLimit"] = staging_size_limit
        pod["metadata"]["name"] = name
        pod["metadata"]["labels"]["app.kubernetes.io/instance"] = deployment
        pod["spec"]["serviceAccountName"] = service_account
        for container in pod["spec"]["containers"]:
            if container["name"] == "engine":
                container["command"] = [*container["command"], *engine_args]
            if container["name"] == "sidecar":
                container["command"] = [*container["command"], *sidecar_args]
            for env in container.get("env", []):
                if env["name"] == "HOTLOAD_DEPLOYMENT":
                    env["value"] = deployment
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None and secret is not None:
                    ref["name"] = secret
        return pod

    def create_secret(self, name: str, data: Mapping[str, str]) -> None:
        self.core.create_namespaced_secret(
            self.namespace, {"metadata": {"name": name}, "stringData": dict(data)}
        )

    def pod_directory(self, name: str, uid: str) -> Path:
        return self.region.directory / "runtime" / "pods" / f"{self.namespace}_{name}_{uid}"

    def container_status(self, name: str, container: str) -> k8s.V1ContainerStatus | None:
        pod = self.pod(name)
        for status in (pod.status.container_statuses if pod.status else None) or []:
            if status.name == container:
                return status
        return None

    def container_pid(self, name: str, container: str) -> int:
        status = self.container_status(name, container)
        if status is None or not status.container_id:
            raise AssertionError(f"{container} of {name} has no container id")
        return int(status.container_id.rsplit("/", 1)[-1])

    def pod(self, name: str) -> k8s.V1Pod:
        return self.core.read_namespaced_pod(name, self.namespace)

    def annotations(self, name: str) -> dict[str, str]:
        return dict(self.pod(name).metadata.annotations or {})

    def gate(self, name: str) -> k8s.V1PodCondition | None:
        pod = self.pod(name)
        for condition in (pod.status.conditions if pod.status else None) or []:
            if condition.type == CONDITION_SNAPSHOT_READY:
                return condition
        return None

    # --- processes -----------------------------------------------------------------

    async def replica(
        self,
        name: str,
        deployment: str,
        *,
        credentials: Mapping[str, str] | None = None,
        sidecar_args: tuple[str, ...] = (),
        engine_args: tuple[str, ...] = ("--threads", "1"),
        serving_timeout: float = 120,
        staging_size_limit: str | None = None,
    ) -> Replica:
        """A pod with its RBAC (and Secret), once its engine and sidecar both answer."""
        self.create_replica(
            name,
            deployment,
            credentials=credentials,
            sidecar_args=sidecar_args,
            engine_args=engine_args,
            staging_size_limit=staging_size_limit,
        )
        replica = await self.addressed(name, deployment)
        await self.wait_serving(replica, timeout=serving_timeout)
        return replica

    def create_replica(
        self,
        name: str,
        deployment: str,
        *,
        credentials: Mapping[str, str] | None = None,
        sidecar_args: tuple[str, ...] = (),
        engine_args: tuple[str, ...] = ("--threads", "1"),
        staging_size_limit: str | None = None,
    ) -> None:
        """Create a pod with its RBAC (and Secret); the runtime starts it."""
        service_account = f"{name}-sidecar"
        self.create_rbac(service_account)
        secret = None
        if credentials:
            secret = f"{name}-bucket"
            self.create_secret(secret, credentials)
        body = self.pod_body(
            name,
            deployment,
            service_account,
            sidecar_args=sidecar_args,
            engine_args=engine_args,
            secret=secret,
            staging_size_limit=staging_size_limit,
        )
        self.core.create_namespaced_pod(self.namespace, body)

    async def addressed(self, name: str, deployment: str) -> Replica:
        """The replica once the runtime gave its pod an address."""

        def addressed() -> tuple[str, str] | None:
            pod = self.pod(name)
            if pod.status and pod.status.pod_ip:
                return pod.status.pod_ip, pod.metadata.uid
            return None

        ip, uid = await eventually(addressed, timeout=60, what=f"pod {name} to get an IP")
        replica = Replica(
            name, ip, uid, self.pod_directory(name, uid), {"HOTLOAD_DEPLOYMENT": deployment}
        )
        self.replicas.append(replica)
        return replica

    async def wait_serving(self, replica: Replica, *, timeout: float = 120) -> None:
        """Until the engine answers /health and the sidecar /healthz."""

        async def answering() -> bool:
            try:
                async with httpx.AsyncClient(trust_env=False) as client:
                    engine = await client.get(f"{replica.engine_url}/health", timeout=2)
                    sidecar = await client.get(f"{replica.front}/healthz", timeout=2)
                return engine.status_code == 200 and sidecar.status_code == 200
            except httpx.HTTPError:
                return False

        try:
            await eventually(
                answering, timeout=timeout, what=f"{replica.pod} serving", interval=0.3
            )
        except AssertionError as err:
            raise AssertionError(
                f"{err}\n{self.log(replica, 'sidecar')}\n{self.log(replica, 'engine')}"
            ) from None

    def kill_sidecar(self, replica: Replica) -> int:
        """SIGKILL the sidecar's process, as a crash or an OOM kill would; its pid."""
        return self.kill(replica, "sidecar")

    def kill(self, replica: Replica, container: str) -> int:
        """SIGKILL one container's process (the runtime restarts it); its pid."""
        pid = self.container_pid(replica.pod, container)
        os.kill(pid, signal.SIGKILL)
        return pid

    def freeze(self, replica: Replica, container: str) -> int:
        """SIGSTOP one container's process: it holds its sockets but does nothing, as a
        process stuck in the kernel would, until the test kills it; its pid."""
        pid = self.container_pid(replica.pod, container)
        os.kill(pid, signal.SIGSTOP)
        return pid

    async def wait_restarted(
        self, replica: Replica, restarts: int, container: str = "sidecar"
    ) -> None:
        """Until the runtime restarted ``container`` ``restarts`` times and the pod answers."""

        def restarted() -> bool:
            status = self.container_status(replica.pod, container)
            return bool(status and status.restart_count >= restarts and status.state.running)

        await eventually(restarted, timeout=60, what=f"the {container} of {replica.pod} to restart")
        await self.wait_serving(replica)

    def log(self, replica: Replica, container: str, tail: int = 4000) -> str:
        path = replica.directory / "logs" / f"{container}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def stop_all(self) -> None:
        """Delete the pods (the runtime stops their processes within their grace)."""
        for replica in self.replicas:
            with contextlib.suppress(k8s.ApiException):
                self.core.delete_namespaced_pod(replica.pod, self.namespace, grace_period_seconds=5)

    # --- observing ----------------------------------------------------------------

    async def status(self, replica: Replica) -> dict[str, Any]:
        async with httpx.AsyncClient(trust_env=False) as client:
            response = await client.get(f"{replica.front}/status", timeout=5)
            response.raise_for_status()
            body: dict[str, Any] = response.json()
            return body

    async def wait_state(
        self, replica: Replica, snapshot: str, state: str, *, timeout: float = 60
    ) -> dict[str, str]:
        """Wait until the pod's annotations say ``state`` with ``snapshot`` as the target."""

        def reached() -> dict[str, str] | None:
            annotations = self.annotations(replica.pod)
            if (
                annotations.get("hotload.dev/target") == snapshot
                and annotations.get("hotload.dev/state") == state
            ):
                return annotations
            return None

        try:
            return await eventually(
                reached, timeout=timeout, what=f"{replica.pod} {state} at {snapshot}"
            )
        except AssertionError as err:
            raise AssertionError(
                f"{err}\n--- sidecar log ---\n{self.log(replica, 'sidecar')}"
            ) from None

    async def engine_identity(self, replica: Replica) -> dict[str, Any]:
        async with httpx.AsyncClient(trust_env=False) as client:
            response = await client.get(f"{replica.engine_url}/admin/identity", timeout=10)
            response.raise_for_status()
            body: dict[str, Any] = response.json()
            return body

    async def engine_logits(self, replica: Replica, tokens: tuple[int, ...]) -> dict[str, Any]:
        async with httpx.AsyncClient(trust_env=False) as client:
            response = await client.post(
                f"{replica.engine_url}/admin/logits",
                json={"prompt_token_ids": list(tokens)},
                timeout=30,
            )
            response.raise_for_status()
            body: dict[str, Any] = response.json()
            return body

    async def complete(
        self,
        replica: Replica,
        prompt: str = "hello",
        *,
        headers: Mapping[str, str] | None = None,
        **extra: Any,
    ) -> httpx.Response:
        """A (non-streamed) completion through the front."""
        async with httpx.AsyncClient(trust_env=False) as client:
            return await client.post(
                f"{replica.front}/v1/completions",
                headers=dict(headers or {}),
                json={
                    "model": replica.env["HOTLOAD_DEPLOYMENT"],
                    "prompt": prompt,
                    "max_tokens": 4,
                    "temperature": 0,
                    **extra,
                },
                timeout=60,
            )


async def token_delay(replica: Replica, seconds: float) -> None:
    """Make the engine slow to generate (a pause before every token)."""
    async with httpx.AsyncClient(trust_env=False) as client:
        response = await client.post(
            f"{replica.engine_url}/admin/token_delay", json={"seconds": seconds}, timeout=10
        )
        response.raise_for_status()

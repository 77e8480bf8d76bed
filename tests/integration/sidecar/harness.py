"""Real replicas for the sidecar's tests: a kwok pod, its engine, its sidecar, its RBAC.

Each replica is what CONTRACTS.md's pod contract describes, run as local processes: a
Pod from ``examples/pod.yaml`` (its containers' commands replaced by a placeholder, so
kwok runs it and gives it an IP in 127.i.0.0/24, real loopback), a ServiceAccount with a
Role made from ``hotload.api.pod.SIDECAR_RBAC_RULES``, a pod-bound token in a kubeconfig
of its own, the real ``hotload engine reference`` process and the real ``hotload
sidecar`` process, both bound to the pod's IP and sharing a staging folder through
``HOTLOAD_ROOT``. Until the operator exists, tests create the RolloutDeployment and
move its ``status.targetSnapshot`` themselves.
"""

from __future__ import annotations

import asyncio
import copy
import os
import signal
import subprocess
import sys
import time
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
    STAGING_MOUNT_PATH,
)
from hotload.api.rollout_deployment import PLURAL
from hotload.local import Region

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[3]
HOTLOAD = str(Path(sys.executable).with_name("hotload"))
PLACEHOLDER = ["sleep", "infinity"]
ENGINE_PORT = 8000


async def eventually(
    probe: Callable[[], Awaitable[T | None]] | Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.1,
) -> T:
    """Poll ``probe`` until it returns something truthy; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        result = probe()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result  # type: ignore[return-value]
        last = result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
        await asyncio.sleep(interval)


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


def _with_staging_mounted(command: list[str], staging: Path) -> list[str]:
    """Run ``command`` with the pod's staging folder bind-mounted at the mount path.

    That is what the engine container of a real pod sees. The sidecar hands the engine
    paths under the *mount path* (CONTRACTS.md); the reference engine does not yet map
    them through ``HOTLOAD_ROOT`` itself, so the test gives it the mount, in a private
    mount namespace (nothing outside the process sees it).
    """
    Path(STAGING_MOUNT_PATH).mkdir(parents=True, exist_ok=True)
    script = 'mount --bind "$0" "$1" && shift && exec "$@"'
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        str(staging),
        STAGING_MOUNT_PATH,
        *command,
    ]


@dataclass
class Replica:
    """One pod's processes and where to reach them."""

    pod: str
    ip: str
    uid: str
    root: Path
    env: dict[str, str]
    logs: Path
    engine: subprocess.Popen[bytes] | None = None
    sidecar: subprocess.Popen[bytes] | None = None
    sidecar_starts: int = 0
    sidecar_args: tuple[str, ...] = ()

    @property
    def front(self) -> str:
        return f"http://{self.ip}:{SIDECAR_PORT}"

    @property
    def engine_url(self) -> str:
        return f"http://{self.ip}:{ENGINE_PORT}"

    @property
    def staging(self) -> Path:
        return self.root / "var/lib/hotload/staging"


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

    def pod_manifest(self, name: str, deployment: str, service_account: str) -> dict[str, Any]:
        """``examples/pod.yaml`` with its name, deployment and SA, commands made placeholders."""
        pod: dict[str, Any] = yaml.safe_load((REPO / "examples/pod.yaml").read_text())
        pod = copy.deepcopy(pod)
        pod["metadata"]["name"] = name
        pod["metadata"]["labels"]["app.kubernetes.io/instance"] = deployment
        pod["spec"]["serviceAccountName"] = service_account
        for container in pod["spec"]["containers"]:
            container["command"] = PLACEHOLDER
            for env in container.get("env", []):
                if env["name"] == "HOTLOAD_DEPLOYMENT":
                    env["value"] = deployment
        return pod

    async def create_pod(self, name: str, deployment: str, service_account: str) -> tuple[str, str]:
        """Create the pod and wait until kwok gives it an IP; (ip, uid)."""
        self.core.create_namespaced_pod(
            self.namespace, self.pod_manifest(name, deployment, service_account)
        )

        def running() -> tuple[str, str] | None:
            pod = self.core.read_namespaced_pod(name, self.namespace)
            if pod.status and pod.status.pod_ip:
                return pod.status.pod_ip, pod.metadata.uid
            return None

        return await eventually(running, timeout=60, what=f"pod {name} to get an IP")

    def pod_kubeconfig(self, service_account: str, pod: str, uid: str, path: Path) -> Path:
        """A kubeconfig holding a token bound to ``pod`` (so an RBAC gap fails the test)."""
        request = self.core.create_namespaced_service_account_token(
            service_account,
            self.namespace,
            {
                "spec": {
                    "audiences": [],
                    "expirationSeconds": 3600,
                    "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod, "uid": uid},
                }
            },
        )
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {
                        "server": self.region.apiserver_url,
                        "certificate-authority": str(self.region.certificates.ca_cert),
                    },
                }
            ],
            "users": [{"name": "sidecar", "user": {"token": request.status.token}}],
            "contexts": [
                {
                    "name": "sidecar",
                    "context": {"cluster": "local", "user": "sidecar", "namespace": self.namespace},
                }
            ],
            "current-context": "sidecar",
        }
        path.write_text(yaml.safe_dump(config))
        return path

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
        start: bool = True,
    ) -> Replica:
        """A pod with its RBAC, token and (unless ``start=False``) engine and sidecar."""
        service_account = f"{name}-sidecar"
        self.create_rbac(service_account)
        ip, uid = await self.create_pod(name, deployment, service_account)
        root = self.workdir / name
        (root / "var/lib/hotload/staging").mkdir(parents=True, exist_ok=True)
        logs = self.workdir / "logs"
        logs.mkdir(exist_ok=True)
        kubeconfig = self.pod_kubeconfig(
            service_account, name, uid, self.workdir / f"{name}.kubeconfig"
        )
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "POD_NAME": name,
            "POD_NAMESPACE": self.namespace,
            "POD_IP": ip,
            "NODE_NAME": "kwok",
            "HOTLOAD_DEPLOYMENT": deployment,
            "HOTLOAD_ROOT": str(root),
            "KUBECONFIG": str(kubeconfig),
            "HOTLOAD_LOG_LEVEL": "DEBUG",
            **(credentials or {}),
        }
        replica = Replica(name, ip, uid, root, env, logs, sidecar_args=sidecar_args)
        self.replicas.append(replica)
        if start:
            await self.start_engine(replica)
            await self.start_sidecar(replica)
        return replica

    async def start_engine(self, replica: Replica) -> None:
        env = {k: v for k, v in replica.env.items() if not k.startswith("AWS_")}
        env.pop("KUBECONFIG", None)
        command = [
            HOTLOAD,
            "engine",
            "reference",
            "--port",
            str(ENGINE_PORT),
            "--threads",
            "1",
            "--served-name",
            env["HOTLOAD_DEPLOYMENT"],
        ]
        replica.engine = subprocess.Popen(
            _with_staging_mounted(command, replica.staging),
            env=env,
            stdout=(replica.logs / f"{replica.pod}-engine.log").open("ab"),
            stderr=subprocess.STDOUT,
        )

        async def healthy() -> bool:
            if replica.engine is not None and replica.engine.poll() is not None:
                raise AssertionError(
                    f"engine of {replica.pod} exited: {self.log(replica, 'engine')}"
                )
            try:
                async with httpx.AsyncClient() as client:
                    return (
                        await client.get(f"{replica.engine_url}/health", timeout=2)
                    ).status_code == 200
            except httpx.HTTPError:
                return False

        await eventually(healthy, timeout=90, what=f"engine of {replica.pod}", interval=0.3)

    async def start_sidecar(self, replica: Replica) -> None:
        replica.sidecar_starts += 1
        replica.sidecar = subprocess.Popen(
            [HOTLOAD, "sidecar", *replica.sidecar_args],
            env=replica.env,
            stdout=(replica.logs / f"{replica.pod}-sidecar.log").open("ab"),
            stderr=subprocess.STDOUT,
        )

        async def listening() -> bool:
            if replica.sidecar is not None and replica.sidecar.poll() is not None:
                raise AssertionError(
                    f"sidecar of {replica.pod} exited: {self.log(replica, 'sidecar')}"
                )
            try:
                async with httpx.AsyncClient() as client:
                    return (
                        await client.get(f"{replica.front}/healthz", timeout=2)
                    ).status_code == 200
            except httpx.HTTPError:
                return False

        await eventually(listening, timeout=60, what=f"sidecar of {replica.pod}", interval=0.2)

    def kill_sidecar(self, replica: Replica) -> None:
        """SIGKILL: no cleanup, as a crash or an OOM kill would leave it."""
        if replica.sidecar is not None:
            replica.sidecar.send_signal(signal.SIGKILL)
            replica.sidecar.wait(10)
            replica.sidecar = None

    def log(self, replica: Replica, container: str) -> str:
        path = replica.logs / f"{replica.pod}-{container}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def stop_all(self) -> None:
        for replica in self.replicas:
            for process in (replica.sidecar, replica.engine):
                if process is not None and process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in (replica.sidecar, replica.engine):
                if process is not None:
                    try:
                        process.wait(15)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait(5)

    # --- observing ----------------------------------------------------------------

    async def status(self, replica: Replica) -> dict[str, Any]:
        async with httpx.AsyncClient() as client:
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
        async with httpx.AsyncClient() as client:
            response = await client.get(f"{replica.engine_url}/admin/identity", timeout=10)
            response.raise_for_status()
            body: dict[str, Any] = response.json()
            return body

    async def engine_logits(self, replica: Replica, tokens: tuple[int, ...]) -> dict[str, Any]:
        async with httpx.AsyncClient() as client:
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
        async with httpx.AsyncClient() as client:
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

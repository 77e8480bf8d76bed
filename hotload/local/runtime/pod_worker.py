"""One pod's life on this host, from its first sight to its deletion.

A worker gives the pod an address, a directory and its ServiceAccount credentials, runs
each of its containers under a :class:`ContainerSupervisor` (a local process, an agent
task in a shared host, the noop engine inside that agent, or an engine image run from
the cache; anything else waits with ``UnsupportedCommand``), keeps its status current,
renews its token, and on deletion stops the containers within the pod's grace period
(SIGTERM, then SIGKILL) before finishing the deletion itself (``gracePeriodSeconds: 0``
with a uid precondition, as a kubelet does once its containers are gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from hotload.api.conditions import rfc3339
from hotload.errors import ContainerConfigInvalid, KubeError, KubeNotFound
from hotload.local.runtime.addresses import AddressPool
from hotload.local.runtime.api_sources import read_sources
from hotload.local.runtime.container import (
    ContainerProbes,
    ContainerSupervisor,
    ContainerView,
    Launch,
    RunningContainer,
    waiting_view,
)
from hotload.local.runtime.credentials import (
    ClusterEndpoint,
    IssuedToken,
    request_token,
    write_pod_kubeconfig,
)
from hotload.local.runtime.environment import (
    ApiSources,
    PodFacts,
    container_argv,
    container_env,
)
from hotload.local.runtime.images import image_argv, image_env, local_image
from hotload.local.runtime.kube_rest import KubeRest
from hotload.local.runtime.ownership import (
    ContainerMode,
    ContainerPlan,
    deployment_of,
    plan_containers,
    pod_key,
)
from hotload.local.runtime.pod_status import (
    TERMINAL_PHASES,
    is_ready,
    status_differs,
    status_patch,
)
from hotload.local.runtime.probes import parse_probe
from hotload.local.runtime.process_ledger import ProcessLedger
from hotload.local.runtime.processes import ProcessSpec, start_process
from hotload.local.runtime.settings import RuntimeSettings
from hotload.local.runtime.shared_host_pool import SharedHosts
from hotload.local.runtime.volumes import PodDirectory
from hotload.mounts import host_path
from hotload.retry import Backoff, RetryPolicy

log = logging.getLogger(__name__)

HOST_IP = "127.0.0.1"
"""Every pod's ``hostIP``: all pods of the local regions share this host."""
DEFAULT_GRACE_S = 30.0
VANISHED_GRACE_S = 2.0
"""Grace for a pod that disappeared without us (force-deleted): kubelet's minimum."""
STATUS_WRITE_RETRY = RetryPolicy(initial_s=0.2, maximum_s=5.0, jitter=0.0)
"""Retries of a failed pod status write: 0.2 s doubling to 5 s."""


@dataclass(frozen=True)
class WorkerDeps:
    """What every worker of one runtime shares."""

    settings: RuntimeSettings
    rest: KubeRest
    endpoint: ClusterEndpoint
    addresses: AddressPool
    ledger: ProcessLedger
    http: httpx.AsyncClient
    shared: SharedHosts
    on_change: Callable[[PodWorker], None]
    """Called whenever something the Service proxy cares about may have changed."""


class InlineContainer:
    """The noop engine of a shared pod: it lives inside the agent, so it 'runs' until
    stopped and has nothing to signal."""

    def __init__(self, container_id: str) -> None:
        self._id = container_id
        self._started = time.monotonic()
        self._ended: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    @property
    def container_id(self) -> str:
        return self._id

    @property
    def ran_for_s(self) -> float:
        return time.monotonic() - self._started

    async def wait(self) -> int:
        return await asyncio.shield(self._ended)

    async def terminate(self, grace_s: float) -> int:
        if not self._ended.done():
            self._ended.set_result(0)
        return await self.wait()


def _grace_of(pod: Mapping[str, Any]) -> float:
    metadata = pod.get("metadata", {})
    value = metadata.get("deletionGracePeriodSeconds")
    if value is None:
        value = pod.get("spec", {}).get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
    return float(value)


def _previous_statuses(pod: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return {str(s.get("name")): s for s in statuses}


class PodWorker:
    def __init__(self, pod: Mapping[str, Any], deps: WorkerDeps) -> None:
        metadata = pod["metadata"]
        self.pod: Mapping[str, Any] = pod
        self.uid = str(metadata["uid"])
        self.key = pod_key(pod)
        self.namespace = str(metadata.get("namespace", "default"))
        self.name = str(metadata["name"])
        self.deps = deps
        self.directory = PodDirectory(deps.settings.pods_dir, pod)
        self.ip = ""
        self._plans: list[ContainerPlan] = plan_containers(pod)
        self._containers: dict[str, Mapping[str, Any]] = {
            str(c["name"]): c for c in pod.get("spec", {}).get("containers") or []
        }
        self._supervisors: dict[str, ContainerSupervisor] = {}
        self._static: dict[str, ContainerView] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self._stop_grace = 0.0
        self._finish_deletion = False
        self._forget = False
        self._dirty = asyncio.Event()
        self._written: dict[str, Any] | None = None
        self._written_conditions: dict[str, Mapping[str, Any]] = {}
        self._written_held = False
        self._world_lock = asyncio.Lock()
        self._token: IssuedToken | None = None
        self._tokens: dict[str | None, str] = {}
        self._start_time = str(
            (pod.get("status") or {}).get("startTime") or rfc3339(datetime.now(UTC))
        )

    # --- what the watch tells us ---------------------------------------------------------

    def observe(self, pod: Mapping[str, Any]) -> None:
        """A newer copy of the pod (its gates may have changed; it may be deleting)."""
        self.pod = pod
        if pod.get("metadata", {}).get("deletionTimestamp") and not self._stop.is_set():
            log.info("pod deleting", extra={"pod": self.key, "grace_s": _grace_of(pod)})
            self._request_stop(_grace_of(pod), finish_deletion=True, forget=True)
        self._poke()

    def vanished(self) -> None:
        """The pod is gone from the API without us finishing its deletion."""
        self._request_stop(
            min(_grace_of(self.pod), VANISHED_GRACE_S), finish_deletion=False, forget=True
        )

    def shutdown(self, cap_s: float) -> None:
        """The runtime stops: stop the containers, keep the pod (a new runtime adopts it)."""
        self._request_stop(min(_grace_of(self.pod), cap_s), finish_deletion=False, forget=False)

    def _request_stop(self, grace_s: float, *, finish_deletion: bool, forget: bool) -> None:
        if self._stop.is_set():
            self._stop_grace = min(self._stop_grace, grace_s)
            self._forget = self._forget or forget
            return
        self._stop_grace = grace_s
        self._finish_deletion = finish_deletion
        self._forget = forget
        self._stop.set()

    # --- what others read ---------------------------------------------------------------

    @property
    def terminating(self) -> bool:
        return self._stop.is_set() or bool(self.pod.get("metadata", {}).get("deletionTimestamp"))

    def views(self) -> list[ContainerView]:
        views = []
        for plan in self._plans:
            supervisor = self._supervisors.get(plan.name)
            if supervisor is not None:
                views.append(supervisor.view())
            elif plan.name in self._static:
                views.append(self._static[plan.name])
            else:
                container = self._containers[plan.name]
                views.append(
                    waiting_view(
                        plan.name, str(container.get("image", "")), "ContainerCreating", ""
                    )
                )
        return views

    def ready(self) -> bool:
        """Ready as Services see it: the pod's Ready, and not terminating."""
        return bool(self.ip) and not self.terminating and is_ready(self.pod, self.views())

    def labels(self) -> Mapping[str, str]:
        return self.pod.get("metadata", {}).get("labels") or {}

    def container_ports(self) -> list[Mapping[str, Any]]:
        return [p for c in self._containers.values() for p in c.get("ports") or []]

    # --- life ---------------------------------------------------------------------------

    async def run(self) -> None:
        writer = asyncio.create_task(self._status_loop(), name=f"status {self.key}")
        try:
            self.ip = self._address()
            self._poke()
            previous_phase = (self.pod.get("status") or {}).get("phase")
            if previous_phase in TERMINAL_PHASES:
                self._keep_final_statuses()
            elif not self._stop.is_set():
                self._start_containers()
            await self._stop.wait()
            await self._stop_containers()
            if self._finish_deletion:
                self._poke()
                await self._flush_status()
                await self._delete()
        finally:
            writer.cancel()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(writer, *self._tasks, return_exceptions=True)
            if self._forget:
                self.directory.remove()
                self.deps.addresses.release(self.uid)
            self.deps.on_change(self)

    def _address(self) -> str:
        pool: AddressPool = self.deps.addresses
        previous = (self.pod.get("status") or {}).get("podIP")
        if previous and pool.reserve(self.uid, str(previous)):
            return str(previous)
        return pool.allocate(self.uid)

    def _keep_final_statuses(self) -> None:
        """A pod that already ended (Succeeded/Failed) is not run again."""
        previous = _previous_statuses(self.pod)
        for plan in self._plans:
            status = previous.get(plan.name, {})
            self._static[plan.name] = ContainerView(
                plan.name,
                str(status.get("image", "")),
                dict(status.get("state") or {"terminated": {"exitCode": 0, "reason": "Completed"}}),
                last_state=dict(status.get("lastState") or {}),
                restart_count=int(status.get("restartCount", 0)),
            )

    def _start_containers(self) -> None:
        settings = self.deps.settings
        previous = _previous_statuses(self.pod)
        policy = str(self.pod.get("spec", {}).get("restartPolicy", "Always"))
        shared = any(p.mode is ContainerMode.SHARED_AGENT for p in self._plans)
        for plan in self._plans:
            container = self._containers[plan.name]
            image = str(container.get("image", ""))
            if plan.mode is ContainerMode.UNSUPPORTED:
                self._static[plan.name] = waiting_view(
                    plan.name, image, "UnsupportedCommand", plan.message
                )
                log.warning(
                    "container cannot run here", extra={"pod": self.key, "container": plan.name}
                )
                continue
            before = previous.get(plan.name, {})
            count = int(before.get("restartCount", 0))
            last_state: dict[str, Any] | None = None
            if "running" in (before.get("state") or {}):
                count += 1
                last_state = {
                    "terminated": {
                        "exitCode": 137,
                        "reason": "Unknown",
                        "message": "the local pod runtime restarted; the container was stopped",
                        "startedAt": before["state"]["running"].get("startedAt"),
                        "finishedAt": rfc3339(datetime.now(UTC)),
                    }
                }
            probes = ContainerProbes()
            if not shared:
                probes = ContainerProbes(
                    readiness=parse_probe(container["readinessProbe"], container)
                    if container.get("readinessProbe")
                    else None,
                    liveness=parse_probe(container["livenessProbe"], container)
                    if container.get("livenessProbe")
                    else None,
                    startup=parse_probe(container["startupProbe"], container)
                    if container.get("startupProbe")
                    else None,
                )
            supervisor = ContainerSupervisor(
                plan.name,
                image,
                self._launcher(plan, container),
                restart_policy=policy,
                backoff=settings.backoff,
                probes=probes,
                pod_ip=self.ip,
                http=self.deps.http,
                kill_grace_s=_grace_of(self.pod),
                on_change=self._poke,
                restart_count=count,
                last_state=last_state,
            )
            self._supervisors[plan.name] = supervisor
            self._tasks.append(
                asyncio.create_task(supervisor.run(), name=f"{self.key}/{plan.name}")
            )
        self._tasks.append(asyncio.create_task(self._renew_tokens(), name=f"tokens {self.key}"))

    async def _stop_containers(self) -> None:
        grace = self._stop_grace
        log.info("stopping pod containers", extra={"pod": self.key, "grace_s": grace})
        await asyncio.gather(
            *(supervisor.stop(grace) for supervisor in self._supervisors.values()),
            return_exceptions=True,
        )
        for task in self._tasks:
            if task.get_name().startswith(self.key):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(asyncio.shield(task), timeout=5.0)

    async def _delete(self) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": self.uid},
        }
        try:
            await self.deps.rest.delete(
                f"/api/v1/namespaces/{self.namespace}/pods/{self.name}", body
            )
            log.info("pod deletion finished", extra={"pod": self.key})
        except KubeNotFound:
            pass
        except KubeError as err:
            log.warning(
                "cannot finish the pod's deletion", extra={"pod": self.key, "error": str(err)}
            )

    # --- launching containers ---------------------------------------------------------

    def _launcher(self, plan: ContainerPlan, container: Mapping[str, Any]) -> Launch:
        if plan.mode is ContainerMode.SHARED_AGENT:

            async def launch_agent() -> RunningContainer:
                env = await self._container_env(container)
                deployment = f"{self.namespace}/{deployment_of(self.pod)}"
                return await self.deps.shared.launch(deployment, self.uid, self.key, env)

            return launch_agent
        if plan.mode is ContainerMode.SHARED_ENGINE:

            async def launch_inline() -> RunningContainer:
                return InlineContainer(f"hotload-inline://{self.uid}/{plan.name}")

            return launch_inline

        async def launch_process() -> RunningContainer:
            env = await self._container_env(container)
            root = self.directory.container_root(plan.name)
            argv = container_argv(container, env, str(self.deps.settings.hotload_executable))
            image = local_image(str(container.get("image", "")))
            if plan.mode is ContainerMode.IMAGE and image is not None:
                own = [str(entry["name"]) for entry in container.get("env") or []]
                env = image_env(image, env, own)
                argv = image_argv(image, container, argv, root)
            cwd = (
                host_path(str(container["workingDir"]), root)
                if container.get("workingDir")
                else root
            )
            spec = ProcessSpec(
                argv=argv,
                env=env,
                cwd=cwd,
                log_path=self.directory.log_path(plan.name),
                ledger_key=f"{self.uid}.{plan.name}",
                what=f"{self.key}/{plan.name}",
            )
            return await start_process(spec, self.deps.ledger)

        return launch_process

    async def _container_env(self, container: Mapping[str, Any]) -> dict[str, str]:
        facts, sources = await self._prepare_world()
        root = self.directory.mount(container)
        endpoint = self.deps.endpoint
        world = {
            "KUBECONFIG": str(self.directory.kubeconfig),
            "KUBERNETES_SERVICE_HOST": endpoint.host,
            "KUBERNETES_SERVICE_PORT": str(endpoint.port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(endpoint.port),
            "HOTLOAD_ROOT": str(root),
        }
        return container_env(
            container, facts, sources, base=self.deps.settings.base_env, world=world
        )

    async def _prepare_world(self) -> tuple[PodFacts, ApiSources]:
        """Credentials, Secrets/ConfigMaps and volumes, refreshed before each start."""
        async with self._world_lock:
            if self._token is None:
                await self._refresh_tokens()
            sources = await read_sources(self.deps.rest, self.pod)
            facts = PodFacts(self.pod, self.ip, HOST_IP)
            self.directory.create()
            self.directory.prepare_volumes(self.pod, facts, sources, self._tokens)
            return facts, sources

    def _audiences(self) -> set[str | None]:
        audiences: set[str | None] = {None}
        for volume in self.pod.get("spec", {}).get("volumes") or []:
            for source in (volume.get("projected") or {}).get("sources") or []:
                token = source.get("serviceAccountToken")
                if token is not None:
                    audiences.add(token.get("audience") or None)
        return audiences

    async def _refresh_tokens(self) -> None:
        settings = self.deps.settings
        tokens: dict[str | None, str] = {}
        main: IssuedToken | None = None
        try:
            for audience in sorted(self._audiences(), key=lambda a: a or ""):
                issued = await request_token(
                    self.deps.rest, self.pod, seconds=settings.token_seconds, audience=audience
                )
                tokens[audience] = issued.token
                if audience is None:
                    main = issued
        except KubeError as err:
            raise ContainerConfigInvalid(
                "cannot get a token for the pod's ServiceAccount",
                pod=self.key,
                service_account=self.pod.get("spec", {}).get("serviceAccountName", "default"),
                error=str(err),
            ) from err
        automount = self.pod.get("spec", {}).get("automountServiceAccountToken", True)
        self.directory.create()
        write_pod_kubeconfig(
            self.directory.kubeconfig,
            self.deps.endpoint,
            main.token if main is not None and automount is not False else None,
            self.namespace,
        )
        self._tokens = tokens
        self._token = main

    async def _renew_tokens(self) -> None:
        """Ask for fresh tokens at 80 % of their lifetime and rewrite every copy."""
        while True:
            token = self._token
            if token is None:
                await asyncio.sleep(5.0)
                continue
            wait_s = (token.renew_at() - datetime.now(UTC)).total_seconds()
            await asyncio.sleep(max(wait_s, 1.0))
            try:
                async with self._world_lock:
                    await self._refresh_tokens()
                    sources = await read_sources(self.deps.rest, self.pod)
                    facts = PodFacts(self.pod, self.ip, HOST_IP)
                    self.directory.prepare_volumes(self.pod, facts, sources, self._tokens)
                log.info("pod token renewed", extra={"pod": self.key})
            except (ContainerConfigInvalid, KubeError) as err:
                log.warning(
                    "token renewal failed; retrying", extra={"pod": self.key, "error": str(err)}
                )
                await asyncio.sleep(10.0)

    # --- status -------------------------------------------------------------------------

    def _poke(self) -> None:
        self._dirty.set()
        self.deps.on_change(self)

    def _body(self) -> dict[str, Any]:
        return status_patch(
            self.pod,
            self.views(),
            pod_ip=self.ip,
            host_ip=HOST_IP,
            start_time=self._start_time,
            now=rfc3339(datetime.now(UTC)),
            written=self._written_conditions,
        )

    async def _write_status(self) -> None:
        """Patch our part of the status when it changed, or when the pod as the server
        holds it no longer says it (another writer, an outage): level-triggered."""
        if not self.ip:
            return
        body = self._body()
        if body == self._written and (not self._written_held or not status_differs(self.pod, body)):
            return
        if body == self._written:
            log.info("pod status repaired (another writer changed it)", extra={"pod": self.key})
        answer = await self.deps.rest.patch(
            f"/api/v1/namespaces/{self.namespace}/pods/{self.name}/status", body
        )
        self._written = body
        self._written_conditions = {c["type"]: c for c in body["status"]["conditions"]}
        if isinstance(answer, dict) and answer.get("metadata", {}).get("uid") == self.uid:
            self.pod = answer
            # Re-assert later only what the server showed it holds: a field it stores
            # differently than we send must never make us patch in a loop.
            self._written_held = not status_differs(answer, body)

    async def _status_loop(self) -> None:
        backoff = Backoff(STATUS_WRITE_RETRY)
        while True:
            await self._dirty.wait()
            await asyncio.sleep(0.05)  # coalesce a burst of changes into one patch
            self._dirty.clear()
            try:
                await self._write_status()
                backoff.reset()
            except KubeNotFound:
                return
            except KubeError as err:
                log.warning("pod status write failed", extra={"pod": self.key, "error": str(err)})
                self._dirty.set()
                await backoff.wait()

    async def _flush_status(self) -> None:
        """Write the final statuses (containers terminated) before finishing a deletion."""
        with contextlib.suppress(KubeError):
            await self._write_status()

"""One region's pod runtime: the process "kubelet" (and kube-proxy) of its fake nodes.

It watches the region's scheduled pods, runs each pod of ours with a
:class:`PodWorker`, watches Services and keeps a local port per service port
(:class:`ServicePorts`). Restart policy: **clean up, then start fresh**. A runtime that
starts first stops every process group a previous runtime left (its ledger), removes
the directories of pods that are gone, then runs the pods it finds as a rebooted node
would: each container starts again (its ``restartCount`` goes up, ``lastState`` says
why), each pod keeps its IP and its volumes, each Service keeps its port. SIGTERM (from
``hotload local down``) stops every container (each within its grace, capped by
``stop_grace_s``), every shared host and every Service port, then exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any, Final

import httpx

from hotload.kube import async_api_client
from hotload.kube.reflector import OnEvent, OnList, Reflector
from hotload.local.runtime.addresses import AddressPool
from hotload.local.runtime.atomic_files import atomic_write_json
from hotload.local.runtime.credentials import cluster_endpoint
from hotload.local.runtime.kube_rest import KubeRest
from hotload.local.runtime.ownership import is_ours
from hotload.local.runtime.pod_worker import PodWorker, WorkerDeps
from hotload.local.runtime.process_ledger import ProcessLedger
from hotload.local.runtime.service_ports import ServicePorts
from hotload.local.runtime.settings import RuntimeSettings
from hotload.local.runtime.shared_host_pool import SharedHosts
from hotload.local.runtime.volumes import remove_stale_pod_dirs
from hotload.retry import RetryPolicy

log = logging.getLogger(__name__)

READY_FILE: Final = "ready.json"
PODS_PATH: Final = "/api/v1/pods"
SERVICES_PATH: Final = "/api/v1/services"


def ready_file(settings: RuntimeSettings) -> Path:
    """Written once the runtime has listed pods and Services and opened their ports."""
    return settings.runtime_dir / READY_FILE


class PodRuntime:
    def __init__(self, settings: RuntimeSettings) -> None:
        self.settings = settings
        self.ledger = ProcessLedger(settings.processes_dir)
        self.workers: dict[str, PodWorker] = {}
        self._worker_tasks: dict[str, asyncio.Task[None]] = {}
        self._stopping = asyncio.Event()
        self._pods_listed = asyncio.Event()
        self._services_listed = asyncio.Event()
        self._service_keys: set[str] = set()
        self._service_dirty = asyncio.Event()
        self._deps: WorkerDeps | None = None
        self.services = ServicePorts(
            settings.services_file,
            settings.runtime_dir / "service-ports.json",
            lambda: list(self.workers.values()),
        )

    def stop(self) -> None:
        """Ask the runtime to stop (what SIGTERM does)."""
        self._stopping.set()

    async def run(self) -> None:
        settings = self.settings
        ready_file(settings).unlink(missing_ok=True)
        reaped = await self.ledger.reap_async()
        if reaped:
            log.warning(
                "stopped processes a previous runtime left behind",
                extra={"region": settings.region, "count": len(reaped)},
            )
        endpoint = cluster_endpoint(settings.kubeconfig, settings.context)
        client = await async_api_client(settings.kubeconfig, context=settings.context)
        http = httpx.AsyncClient(trust_env=False, follow_redirects=False)
        rest = KubeRest(client)
        shared = SharedHosts(settings, self.ledger)
        self._deps = WorkerDeps(
            settings=settings,
            rest=rest,
            endpoint=endpoint,
            addresses=AddressPool(settings.index),
            ledger=self.ledger,
            http=http,
            shared=shared,
            on_change=lambda _worker: self.services.pods_changed(),
        )

        def reflector(path: str, on_list: OnList, on_event: OnEvent, **params: str) -> Reflector:
            return Reflector(
                lambda: rest.client,
                path,
                on_list,
                on_event,
                params=list(params.items()),
                retry=RetryPolicy(initial_s=0.2, maximum_s=5.0, jitter=0.0),
                watch_timeout_s=300,
            )

        pods = reflector(
            PODS_PATH,
            lambda items, _: self._pods_listed_now(items),
            self._pod_event,
            fieldSelector="spec.nodeName!=",
        )
        services = reflector(
            SERVICES_PATH, lambda items, _: self._services_listed_now(items), self._service_event
        )
        watchers = [
            asyncio.create_task(pods.run(), name="pods"),
            asyncio.create_task(services.run(), name="services"),
            asyncio.create_task(self._reconcile_services(), name="service ports"),
        ]
        try:
            await self._announce_ready()
            await self._stopping.wait()
        finally:
            log.info(
                "runtime stopping", extra={"region": settings.region, "pods": len(self.workers)}
            )
            for task in watchers:
                task.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
            await self._stop_workers()
            await shared.close()
            await self.services.close()
            await http.aclose()
            await client.close()
            ready_file(settings).unlink(missing_ok=True)
            log.info("runtime stopped", extra={"region": settings.region})

    async def _announce_ready(self) -> None:
        """Write the ready file once both lists are in and the ports are open."""

        async def listed() -> None:
            await self._pods_listed.wait()
            await self._services_listed.wait()

        both = asyncio.create_task(listed())
        stop = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({both, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            both.cancel()
            stop.cancel()
        if self._stopping.is_set():
            return
        await self._reconcile_now()
        atomic_write_json(
            ready_file(self.settings),
            {"pid": os.getpid(), "services": self.services.ports()},
        )
        log.info(
            "runtime ready",
            extra={"region": self.settings.region, "pods": len(self.workers)},
        )

    # --- pods -------------------------------------------------------------------------

    def _pods_listed_now(self, items: list[dict[str, Any]]) -> None:
        ours = {pod["metadata"]["uid"]: pod for pod in items if is_ours(pod)}
        if self._deps is not None:
            # Pods keep their addresses: hold every one already in use before any new
            # pod of this list is given one.
            for uid, pod in ours.items():
                address = (pod.get("status") or {}).get("podIP")
                if address and uid not in self.workers:
                    self._deps.addresses.reserve(uid, str(address))
        for uid, worker in list(self.workers.items()):
            if uid not in ours:
                worker.vanished()
        for pod in ours.values():
            self._pod_event("MODIFIED", pod)
        if not self._pods_listed.is_set():
            removed = remove_stale_pod_dirs(self.settings.pods_dir, set(ours) | set(self.workers))
            if removed:
                log.info("removed files of pods that are gone", extra={"count": len(removed)})
            self._pods_listed.set()

    def _pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        if not is_ours(pod) or not pod.get("spec", {}).get("nodeName"):
            return
        uid = str(pod["metadata"]["uid"])
        worker = self.workers.get(uid)
        if kind == "DELETED":
            if worker is not None:
                worker.vanished()
            return
        if worker is not None:
            worker.observe(pod)
            return
        if self._stopping.is_set() or self._deps is None:
            return
        worker = PodWorker(pod, self._deps)
        self.workers[uid] = worker
        task = asyncio.get_running_loop().create_task(worker.run(), name=f"pod {worker.key}")
        self._worker_tasks[uid] = task
        task.add_done_callback(lambda done: self._worker_done(uid, worker, done))
        worker.observe(pod)
        log.info("pod taken", extra={"pod": worker.key, "uid": uid})

    def _worker_done(self, uid: str, worker: PodWorker, task: asyncio.Task[None]) -> None:
        if self.workers.get(uid) is worker:
            del self.workers[uid]
            self._worker_tasks.pop(uid, None)
        self.services.pods_changed()
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "pod worker failed",
                extra={"pod": worker.key, "error": repr(task.exception())},
                exc_info=task.exception(),
            )

    async def _stop_workers(self) -> None:
        for worker in list(self.workers.values()):
            worker.shutdown(self.settings.stop_grace_s)
        tasks = list(self._worker_tasks.values())
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.settings.stop_grace_s + 10.0)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    # --- services ----------------------------------------------------------------------

    def _services_listed_now(self, items: list[dict[str, Any]]) -> None:
        self._service_keys |= self.services.replace_all(items)
        self._service_dirty.set()
        self._services_listed.set()

    def _service_event(self, kind: str, obj: dict[str, Any]) -> None:
        self._service_keys |= self.services.apply_event(kind, obj)
        self._service_dirty.set()

    async def _reconcile_now(self) -> None:
        keys, self._service_keys = self._service_keys, set()
        self._service_dirty.clear()
        await self.services.reconcile(keys)

    async def _reconcile_services(self) -> None:
        while True:
            await self._service_dirty.wait()
            try:
                await self._reconcile_now()
            except OSError as err:
                log.error("cannot open a service port", extra={"error": str(err)})
                await asyncio.sleep(1.0)


async def run_runtime(settings: RuntimeSettings) -> None:
    """Run until SIGTERM or SIGINT (the process entry of ``hotload local runtime``)."""
    runtime = PodRuntime(settings)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, runtime.stop)
    try:
        await runtime.run()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signum)


def read_ready(settings: RuntimeSettings) -> dict[str, Any] | None:
    try:
        data = json.loads(ready_file(settings).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None

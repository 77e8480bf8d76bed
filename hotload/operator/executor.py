"""The operator's API calls, thin: each one counted, each failure a typed ``KubeError``.

Responses are read as raw JSON (``_preload_content=False``): the reconciler keeps plain
dicts, and turning a 1,000-pod list into generated model objects would cost more than
the whole reconcile. Writes are merge patches of status (only what changed), server-side
apply of owned objects (field manager ``hotload-operator``, forced: the operator owns
those fields, so another writer's change to them is repaired), deletes with uid and
resourceVersion preconditions, and Events.

Every write is fenced (``fencing.py``): it is not sent unless this operator holds the
leader Lease now, it carries the tenure's token (``status.fence``, or the
``hotload.dev/fence`` annotation of an Event), and a status write is conditioned on the
resourceVersion the caller planned it from, so a view older than the object never
overwrites it. The helpers here are the one way to write a decision; a refusal by the
chart's fencing policy becomes :class:`~hotload.errors.NotLeader`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Final

from kubernetes_asyncio.client import (
    ApiClient,
    AppsV1Api,
    CoreV1Api,
    CustomObjectsApi,
    NetworkingV1Api,
    RbacAuthorizationV1Api,
)

from hotload.api import GROUP, VERSION
from hotload.api.policy_snapshot import KIND as SNAPSHOT_KIND
from hotload.api.policy_snapshot import PLURAL as SNAPSHOTS
from hotload.api.rollout_deployment import KIND as DEPLOYMENT_KIND
from hotload.api.rollout_deployment import PLURAL as DEPLOYMENTS
from hotload.errors import KubeError, KubeForbidden, NotLeader
from hotload.kube import kube_errors
from hotload.kube.raw import read_json
from hotload.operator.fencing import (
    Fence,
    Leadership,
    Standalone,
    fenced_metadata,
    fenced_status,
)
from hotload.operator.metrics import OperatorMetrics
from hotload.operator.plan import EventSpec

log = logging.getLogger(__name__)

FIELD_MANAGER: Final = "hotload-operator"
EVENT_SOURCE: Final = "hotload-operator"
RECONNECT_EVERY_S: Final = 5.0
MERGE_PATCH: Final = "application/merge-patch+json"
APPLY_PATCH: Final = "application/apply-patch+yaml"
#: Every refusal of the chart's fencing policy says this (charts/hotload: fencing-policy.yaml).
FENCE_REFUSAL: Final = "hotload-fence"

Body = dict[str, Any]


class KubeExecutor:
    """The calls one operator makes, on one async client.

    The client is built by ``connect`` (from ``KUBECONFIG`` or the in-cluster account) and
    built again by :meth:`reconnect` when the apiserver refuses its token: pod-bound tokens
    are rotated (the kubelet, or the local runtime, rewrites them before they expire), and
    a client keeps the token it was built with.
    """

    def __init__(
        self,
        api: ApiClient,
        metrics: OperatorMetrics,
        identity: str,
        connect: Callable[[], Awaitable[ApiClient]] | None = None,
        leadership: Leadership | None = None,
    ) -> None:
        self._metrics = metrics
        self._identity = identity
        self._connect = connect
        self.leadership: Leadership = leadership or Standalone()
        self._connected_at = float("-inf")
        self._use(api)

    def _use(self, api: ApiClient) -> None:
        self.api = api
        # Typed as Any: the calls pass the client's private options (_content_type,
        # _preload_content) that its generated signatures do not declare.
        self._core: Any = CoreV1Api(api)
        self._apps: Any = AppsV1Api(api)
        self._rbac: Any = RbacAuthorizationV1Api(api)
        self._networking: Any = NetworkingV1Api(api)
        self._custom: Any = CustomObjectsApi(api)

    async def reconnect(self) -> None:
        """A fresh client with the credentials as they are now (after a 401).

        Every reconciler that meets the 401 asks; one rebuild per few seconds serves them all.
        """
        now = asyncio.get_running_loop().time()
        if self._connect is None or now - self._connected_at < RECONNECT_EVERY_S:
            return
        self._connected_at = now
        fresh = await self._connect()
        stale, self.api = self.api, fresh
        self._use(fresh)
        await stale.close()
        log.info("API client rebuilt with fresh credentials")

    async def close(self) -> None:
        await self.api.close()

    def _count(self, verb: str, resource: str) -> None:
        self._metrics.api_requests.labels(verb, resource).inc()

    # --- reads -------------------------------------------------------------------------

    async def list_snapshots(self, namespace: str) -> Body:
        self._count("list", SNAPSHOTS)
        with kube_errors(namespace=namespace, resource=SNAPSHOTS):
            return await read_json(
                self._custom.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, SNAPSHOTS, _preload_content=False
                )
            )

    # --- status ------------------------------------------------------------------------

    def fence(self) -> Fence | None:
        """The fence for a write about to be sent (raises ``NotLeader``: nothing is sent)."""
        return self.leadership.fence()

    @contextmanager
    def _fenced(self, **context: Any) -> Iterator[None]:
        """Map API errors; a refusal of the fencing policy means our tenure is over."""
        try:
            with kube_errors(**context):
                yield
        except KubeForbidden as err:
            if FENCE_REFUSAL not in str(err):
                raise
            self.leadership.suspect()
            raise NotLeader("the apiserver refused a write with our fence", **context) from err

    async def patch_status(
        self,
        plural: str,
        kind: str,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        resource_version: str | None = None,
    ) -> Body:
        """Merge-patch ``status`` with our fence, conditioned on ``resource_version`` (the
        version the patch was planned from: a newer object answers 409, ``KubeConflict``)."""
        fence = self.fence()
        body: dict[str, Any] = {"status": fenced_status(status, fence)}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        self._count("patch", f"{plural}/status")
        self._metrics.status_writes.labels(kind).inc()
        with self._fenced(namespace=namespace, name=name, resource=f"{plural}/status"):
            return await read_json(
                self._custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, namespace, plural, name, body,
                    _content_type=MERGE_PATCH, _preload_content=False,
                )
            )  # fmt: skip

    async def patch_deployment_status(
        self,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        resource_version: str | None = None,
    ) -> Body:
        return await self.patch_status(
            DEPLOYMENTS, DEPLOYMENT_KIND, namespace, name, status, resource_version
        )

    async def patch_snapshot_status(
        self,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        resource_version: str | None = None,
    ) -> Body:
        return await self.patch_status(
            SNAPSHOTS, SNAPSHOT_KIND, namespace, name, status, resource_version
        )

    async def patch_snapshot_metadata(
        self,
        namespace: str,
        name: str,
        metadata: Mapping[str, Any],
        resource_version: str | None = None,
    ) -> Body:
        """Merge-patch a PolicySnapshot's metadata (its finalizers, our annotations) with our
        fence, conditioned on ``resource_version``."""
        fence = self.fence()
        patch = fenced_metadata(metadata, fence)
        if resource_version:
            patch["resourceVersion"] = resource_version
        self._count("patch", SNAPSHOTS)
        with self._fenced(namespace=namespace, name=name, resource=SNAPSHOTS):
            return await read_json(
                self._custom.patch_namespaced_custom_object(
                    GROUP, VERSION, namespace, SNAPSHOTS, name, {"metadata": patch},
                    _content_type=MERGE_PATCH, _preload_content=False,
                )
            )  # fmt: skip

    async def get_snapshot(self, namespace: str, name: str) -> Body:
        self._count("get", SNAPSHOTS)
        with kube_errors(namespace=namespace, name=name, resource=SNAPSHOTS):
            return await read_json(
                self._custom.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, SNAPSHOTS, name, _preload_content=False
                )
            )

    async def get_deployment(self, namespace: str, name: str) -> Body:
        self._count("get", DEPLOYMENTS)
        with kube_errors(namespace=namespace, name=name, resource=DEPLOYMENTS):
            return await read_json(
                self._custom.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, DEPLOYMENTS, name, _preload_content=False
                )
            )

    async def delete_snapshot(
        self, namespace: str, name: str, uid: str, resource_version: str | None = None
    ) -> None:
        """Delete one PolicySnapshot, only the object we decided about (uid and, when
        given, resourceVersion preconditions), only while we lead."""
        self.fence()
        preconditions = {"uid": uid}
        if resource_version:
            preconditions["resourceVersion"] = resource_version
        self._count("delete", SNAPSHOTS)
        with kube_errors(namespace=namespace, name=name, resource=SNAPSHOTS):
            await read_json(
                self._custom.delete_namespaced_custom_object(
                    GROUP, VERSION, namespace, SNAPSHOTS, name,
                    body={"preconditions": preconditions}, _preload_content=False,
                )
            )  # fmt: skip

    # --- owned objects -----------------------------------------------------------------

    async def apply(self, obj: Mapping[str, Any]) -> Body:
        """Server-side apply one owned object (created when absent, repaired when changed)."""
        kind = obj["kind"]
        namespace = obj["metadata"]["namespace"]
        name = obj["metadata"]["name"]
        self.fence()  # owned objects carry no token; they are applied only while we lead
        body = dict(obj)  # JSON is YAML: the client sends it as JSON text
        options: dict[str, Any] = {
            "field_manager": FIELD_MANAGER,
            "force": True,
            "_content_type": APPLY_PATCH,
            "_preload_content": False,
        }
        self._count("apply", kind)
        with kube_errors(namespace=namespace, name=name, kind=kind):
            call: Awaitable[Any]
            if kind == "StatefulSet":
                call = self._apps.patch_namespaced_stateful_set(name, namespace, body, **options)
            elif kind == "Service":
                call = self._core.patch_namespaced_service(name, namespace, body, **options)
            elif kind == "ServiceAccount":
                call = self._core.patch_namespaced_service_account(name, namespace, body, **options)
            elif kind == "RoleBinding":
                call = self._rbac.patch_namespaced_role_binding(name, namespace, body, **options)
            elif kind == "NetworkPolicy":
                call = self._networking.patch_namespaced_network_policy(
                    name, namespace, body, **options
                )
            else:
                raise KubeError("the operator does not manage this kind", kind=kind)
            return await read_json(call)

    # --- events ------------------------------------------------------------------------

    async def emit(self, namespace: str, event: EventSpec) -> None:
        """Create one core/v1 Event about one of our objects, carrying our fence."""
        fence = self.fence()
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": fenced_metadata(
                {"generateName": f"{event.name}.", "namespace": namespace}, fence
            ),
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": event.kind,
                "name": event.name,
                "namespace": namespace,
                "uid": event.uid,
            },
            "type": event.type.value,
            "reason": event.reason,
            "message": event.message[:1024],
            "source": {"component": EVENT_SOURCE, "host": self._identity[:253]},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        self._count("create", "events")
        self._metrics.events.labels(event.type.value, event.reason).inc()
        with self._fenced(namespace=namespace, resource="events", reason=event.reason):
            await read_json(
                self._core.create_namespaced_event(namespace, body, _preload_content=False)
            )

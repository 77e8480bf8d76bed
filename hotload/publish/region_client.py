"""One region as the publisher sees it: its RolloutDeployment (where its bucket is) and its
PolicySnapshots (apply, and read back Ready / ChainValid), through one kube context.

Every call has a short request timeout: a region whose apiserver is down must answer
"unreachable" quickly, so that it never holds the other regions up.
"""

from __future__ import annotations

import logging
import threading
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

import kubernetes.client

from hotload.api import GROUP, VERSION, PolicySnapshot, RolloutDeployment
from hotload.api import conditions as cond
from hotload.api.labels import (
    DEPLOYMENT_LABEL,
    MANAGED_BY_LABEL,
    MANAGED_BY_PUBLISHER,
    PUBLISH_ENDPOINT_ANNOTATION,
    SWITCH_ABORTED_ANNOTATION,
    SWITCH_AT_ANNOTATION,
)
from hotload.api.policy_snapshot import PLURAL as SNAPSHOTS
from hotload.api.rollout_deployment import PLURAL as DEPLOYMENTS
from hotload.api.rollout_deployment import RolloutSpec
from hotload.api.switch import SwitchDecision
from hotload.errors import KubeError, KubeNotFound, PublishConflict
from hotload.kube import kube_errors, sync_api_client

log = logging.getLogger(__name__)

#: (connect, read) seconds for every API call.
REQUEST_TIMEOUT: Final = (3.0, 15.0)


@dataclass(frozen=True)
class RegionBucket:
    """A region's bucket, as its RolloutDeployment names it."""

    context: str
    bucket_url: str
    endpoint: str | None
    """Where the publisher writes (the publish-endpoint annotation, else spec.hotLoad.endpoint)."""
    region: str | None

    @property
    def key(self) -> tuple[str, str | None]:
        """Two regions with the same key share one bucket: it is written once."""
        return (self.bucket_url, self.endpoint)


@dataclass(frozen=True)
class SnapshotState:
    """What a region says about one PolicySnapshot (None: not said yet)."""

    exists: bool
    ready: bool | None = None
    ready_reason: str | None = None
    chain_valid: bool | None = None
    chain_reason: str | None = None
    chain_message: str | None = None
    ready_replicas: int | None = None
    desired_replicas: int | None = None
    staged_replicas: int | None = None
    """Coordinated switch: replicas Staged for it or serving it (or newer)."""
    switch_decision: SwitchDecision | None = None
    """Coordinated switch: the operator's ``status.switch.decision``."""
    decided: tuple[str, str] | None = None
    """The switch decision written on it (annotation, value), if any."""


#: The publisher's switch decisions on a PolicySnapshot: one of them, written once.
DECISION_ANNOTATIONS: Final = (SWITCH_AT_ANNOTATION, SWITCH_ABORTED_ANNOTATION)


def written_decision(raw: dict[str, Any]) -> tuple[str, str] | None:
    """The switch decision on a PolicySnapshot (a commit wins over an abort)."""
    annotations = (raw.get("metadata") or {}).get("annotations") or {}
    for key in DECISION_ANNOTATIONS:
        if isinstance(annotations.get(key), str):
            return key, str(annotations[key])
    return None


def _decision(status: dict[str, Any]) -> SwitchDecision | None:
    try:
        return SwitchDecision(str((status.get("switch") or {}).get("decision")))
    except ValueError:
        return None


def _truth(condition: cond.Condition | None) -> bool | None:
    if condition is None or condition.status is cond.ConditionStatus.UNKNOWN:
        return None
    return condition.status is cond.ConditionStatus.TRUE


def snapshot_state(raw: dict[str, Any] | None) -> SnapshotState:
    """Read Ready, ChainValid and the replica counts from a PolicySnapshot object."""
    if raw is None:
        return SnapshotState(exists=False)
    status = raw.get("status") or {}
    conditions = [cond.Condition.model_validate(c) for c in status.get("conditions") or []]
    ready = cond.find_condition(conditions, cond.READY)
    chain = cond.find_condition(conditions, cond.CHAIN_VALID)
    return SnapshotState(
        exists=True,
        ready=_truth(ready),
        ready_reason=ready.reason if ready else None,
        chain_valid=_truth(chain),
        chain_reason=chain.reason if chain else None,
        chain_message=chain.message if chain else None,
        ready_replicas=status.get("readyReplicas"),
        desired_replicas=status.get("desiredReplicas"),
        staged_replicas=status.get("stagedReplicas"),
        switch_decision=_decision(status),
        decided=written_decision(raw),
    )


class RegionClient:
    """The publisher's calls to one region, from any thread (one API client, made on
    first use)."""

    def __init__(
        self, context: str, kubeconfig: Path | None, namespace: str, deployment: str
    ) -> None:
        self.context = context
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.deployment = deployment
        self._api: kubernetes.client.ApiClient | None = None
        self._lock = threading.Lock()

    def _custom(self) -> kubernetes.client.CustomObjectsApi:
        with self._lock:
            if self._api is None:
                self._api = sync_api_client(self.kubeconfig, context=self.context)
            return kubernetes.client.CustomObjectsApi(self._api)

    def _errors(self, **context: Any) -> AbstractContextManager[None]:
        return kube_errors(context_name=self.context, namespace=self.namespace, **context)

    def _deployment(self) -> dict[str, Any]:
        with self._errors(deployment=self.deployment):
            return cast(dict[str, Any], self._custom().get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, DEPLOYMENTS, self.deployment,
                _request_timeout=REQUEST_TIMEOUT,
            ))  # fmt: skip

    def rollout(self) -> RolloutSpec:
        """How the region's deployment switches (``spec.rollout``; KubeNotFound without one)."""
        return RolloutDeployment.model_validate(self._deployment()).spec.rollout

    def decide_once(self, identity: str, annotation: str, value: str) -> tuple[str, str]:
        """Write a switch decision on the PolicySnapshot unless one is there already, and
        return the decision it holds now: written once, by a write conditioned on the
        version read (a concurrent writer makes it read again). KubeNotFound when the
        snapshot is not in the region."""
        while True:
            raw = self.get_snapshot(identity)
            if raw is None:
                raise KubeNotFound(
                    "the PolicySnapshot is not in the region",
                    context=self.context,
                    namespace=self.namespace,
                    snapshot=identity,
                )
            held = written_decision(raw)
            if held is not None:
                return held
            version = (raw.get("metadata") or {}).get("resourceVersion")
            patch = {"metadata": {"resourceVersion": version, "annotations": {annotation: value}}}
            try:
                with self._errors(snapshot=identity):
                    self._custom().patch_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, SNAPSHOTS, identity, patch,
                        _request_timeout=REQUEST_TIMEOUT,
                    )  # fmt: skip
            except KubeError as err:
                if err.status == 409:
                    continue  # changed since read: read it again
                raise
            return annotation, value

    def bucket(self, endpoint_override: str | None = None) -> RegionBucket:
        """The region's bucket from its RolloutDeployment (KubeNotFound when it has none)."""
        raw = self._deployment()
        deployment = RolloutDeployment.model_validate(raw)
        hot_load = deployment.spec.hot_load
        annotations = (raw.get("metadata") or {}).get("annotations") or {}
        endpoint = endpoint_override or annotations.get(PUBLISH_ENDPOINT_ANNOTATION)
        return RegionBucket(
            context=self.context,
            bucket_url=hot_load.bucket_url,
            endpoint=endpoint or hot_load.endpoint,
            region=hot_load.region,
        )

    def get_snapshot(self, identity: str) -> dict[str, Any] | None:
        try:
            with self._errors(snapshot=identity):
                raw = cast(dict[str, Any], self._custom().get_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, SNAPSHOTS, identity,
                    _request_timeout=REQUEST_TIMEOUT,
                ))  # fmt: skip
        except KubeNotFound:
            return None
        return raw

    def apply(self, snapshot: PolicySnapshot) -> bool:
        """Create the PolicySnapshot; True when created, False when the same one was there.

        A snapshot of that name with another spec is a :class:`PublishConflict`: identities
        name one snapshot forever (the spec is immutable).
        """
        body = snapshot.to_k8s()
        metadata = body.setdefault("metadata", {})
        labels = metadata.setdefault("labels", {})
        labels.setdefault(DEPLOYMENT_LABEL, snapshot.spec.deployment_ref.name)
        labels.setdefault(MANAGED_BY_LABEL, MANAGED_BY_PUBLISHER)
        identity = snapshot.spec.identity
        try:
            with self._errors(snapshot=identity):
                self._custom().create_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, SNAPSHOTS, body,
                    _request_timeout=REQUEST_TIMEOUT,
                )  # fmt: skip
            return True
        except KubeError as err:
            if err.status != 409:
                raise
        existing = self.get_snapshot(identity)
        if existing is None:  # deleted between the two calls: try once more
            return self.apply(snapshot)
        if PolicySnapshot.model_validate(existing).spec != snapshot.spec:
            raise PublishConflict(
                "a PolicySnapshot of this name with another spec exists in the region",
                context=self.context,
                namespace=self.namespace,
                snapshot=identity,
            )
        return False

    def snapshot_state(self, identity: str) -> SnapshotState:
        return snapshot_state(self.get_snapshot(identity))

    def list_snapshots(self) -> list[dict[str, Any]]:
        """Every PolicySnapshot in the namespace (all deployments)."""
        with self._errors():
            listed = cast(
                dict[str, Any],
                self._custom().list_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, SNAPSHOTS, _request_timeout=REQUEST_TIMEOUT
                ),
            )
        items: list[dict[str, Any]] = listed.get("items") or []
        return items

    def broken(self, identities: set[str]) -> list[str]:
        """Those of ``identities`` the region marked ``ChainValid=False``."""
        found = []
        for raw in self.list_snapshots():
            name = (raw.get("metadata") or {}).get("name")
            if name in identities and snapshot_state(raw).chain_valid is False:
                found.append(str(name))
        return sorted(found)

    def close(self) -> None:
        with self._lock:
            if self._api is not None:
                self._api.close()  # type: ignore[no-untyped-call]
                self._api = None

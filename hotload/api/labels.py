"""Labels, annotations and finalizers hotload puts on Kubernetes objects (beside the pod
contract of :mod:`hotload.api.pod`).

The operator selects its replica pods and owned objects by these, the publisher marks the
PolicySnapshots it applies, the local runtime and the CLI read them back: one spelling
each, here.
"""

from __future__ import annotations

from typing import Final

# Kubernetes' recommended labels.
NAME_LABEL: Final = "app.kubernetes.io/name"
INSTANCE_LABEL: Final = "app.kubernetes.io/instance"
"""On replica pods and owned objects: the RolloutDeployment's name."""
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
PART_OF_LABEL: Final = "app.kubernetes.io/part-of"

REPLICA_NAME: Final = "hotload-replica"
"""The ``app.kubernetes.io/name`` of every replica pod."""
MANAGED_BY_OPERATOR: Final = "hotload"
"""``app.kubernetes.io/managed-by`` of the objects the operator renders and applies."""
MANAGED_BY_PUBLISHER: Final = "hotload-publish"
"""``app.kubernetes.io/managed-by`` of the PolicySnapshots the publisher applies."""
PART_OF: Final = "hotload"
"""``app.kubernetes.io/part-of`` of the CRDs and the chart's objects."""

DEPLOYMENT_LABEL: Final = "hotload.dev/deployment"
"""On every PolicySnapshot the publisher applies: the RolloutDeployment it is for."""
PUBLISH_ENDPOINT_ANNOTATION: Final = "hotload.dev/publish-endpoint"
"""On a RolloutDeployment: where the trainer's side reaches this region's bucket, when that
differs from the in-region ``spec.hotLoad.endpoint`` the replicas use (e.g. across a WAN
proxy)."""

OPERATOR_FINALIZER: Final = "hotload.dev/operator"
SERVED_FINALIZER: Final = "hotload.dev/served"
"""On a PolicySnapshot while it is its deployment's target or some replica serves it: a
deletion waits (the operator says so in an Event) until neither holds, instead of rolling
the fleet back."""
DELETION_HELD_ANNOTATION: Final = "hotload.dev/deletion-held"
"""On a PolicySnapshot whose deletion the operator holds: when it first said so (one Event)."""
OPERATOR_ANNOTATION_PREFIX: Final = "operator.hotload.dev"
"""kopf's progress and diff-base annotations on our objects live under this prefix."""

FENCE_ANNOTATION: Final = "hotload.dev/fence"
"""On the objects the operator writes outside a status (its Events, a PolicySnapshot's
finalizers): the writer's fence token ``<holder>/<leaseTransitions>`` of the region's leader
Lease. Status writes carry the same token in ``status.fence``. The chart's admission policy
refuses an operator write whose token is not the Lease's now (docs/operator.md, "Fencing")."""

SWITCH_AT_ANNOTATION: Final = "hotload.dev/switch-at"
"""On a PolicySnapshot of a Coordinated deployment: the switch time the publisher committed
(RFC 3339, UTC, ms), written once, when every replica of every region is Staged or the
staging timeout passed. The operator copies it into ``status.targetSnapshot.switchAt``."""
SWITCH_BY_ANNOTATION: Final = "hotload.dev/switch-by"
"""On a PolicySnapshot of a Coordinated deployment, set by the publisher when it applies it
(the same in every region): the deadline after which, with no decision, replicas presume
``spec.rollout.onStagingTimeout`` (without it: creation + stagingTimeoutSeconds + lead)."""
SWITCH_ABORTED_ANNOTATION: Final = "hotload.dev/switch-aborted"
"""On a PolicySnapshot of a Coordinated deployment: the publisher aborted its switch (the
time it decided), written once, instead of ``switch-at``. Nobody switches to it."""

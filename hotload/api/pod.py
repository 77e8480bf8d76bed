"""The pod contract (CONTRACTS.md): what our pods carry and what the sidecar writes on them.

The sidecar writes only its own Pod; these names are the whole channel between it and the
operator, so they live here, once.
"""

from __future__ import annotations

from typing import Final

ANNOTATION_PREFIX: Final = "hotload.dev/"
ANNOTATION_SNAPSHOT: Final = "hotload.dev/snapshot"
"""Identity the replica serves now."""
ANNOTATION_TARGET: Final = "hotload.dev/target"
"""Identity it is working on."""
ANNOTATION_STATE: Final = "hotload.dev/state"
"""Loading | Ready | Failed, relative to the target (Ready means snapshot == target, verified)."""
ANNOTATION_SINCE: Final = "hotload.dev/since"
"""RFC 3339 UTC time of the last transition."""
ANNOTATION_VIA: Final = "hotload.dev/via"
"""delta | full | replay | reload."""
ANNOTATION_REASON: Final = "hotload.dev/reason"
"""While Failed: a reason of :mod:`hotload.api.reasons` (its class says what it means)."""
ANNOTATION_MESSAGE: Final = "hotload.dev/message"
ANNOTATION_DIGEST: Final = "hotload.dev/digest"
"""The weights digest the sidecar verified of what the engine serves (the tensor-set digest
of the snapshot named by ``snapshot``); absent where the engine offers none. The operator
counts a replica toward Ready on its report only when it can corroborate it."""
ANNOTATION_FAILED_SNAPSHOT: Final = "hotload.dev/failed-snapshot"
"""While Failed: the snapshot whose files failed (during a replay an earlier link than
the target may be the bad one); the operator marks that snapshot."""
ANNOTATION_SWITCH: Final = "hotload.dev/switch"
"""Coordinated switch only: Staged (state Loading: the target staged, waiting for the
switch time), OnTime or Late (state Ready). Absent otherwise."""
ANNOTATION_RUNTIME: Final = "hotload.dev/runtime"
"""`shared` asks the local pod runtime to run this pod's agent as a task in one process."""
RUNTIME_SHARED: Final = "shared"

SIDECAR_ANNOTATIONS: Final = (
    ANNOTATION_SNAPSHOT,
    ANNOTATION_DIGEST,
    ANNOTATION_TARGET,
    ANNOTATION_STATE,
    ANNOTATION_SINCE,
    ANNOTATION_VIA,
    ANNOTATION_REASON,
    ANNOTATION_MESSAGE,
    ANNOTATION_FAILED_SNAPSHOT,
    ANNOTATION_SWITCH,
)

CONDITION_SNAPSHOT_READY: Final = "hotload.dev/SnapshotReady"
"""Pod condition and readiness gate: "this pod serves a verified snapshot"."""

# Environment of our containers (downward API plus the deployment's name).
ENV_POD_NAME: Final = "POD_NAME"
ENV_POD_NAMESPACE: Final = "POD_NAMESPACE"
ENV_POD_IP: Final = "POD_IP"
ENV_NODE_NAME: Final = "NODE_NAME"
ENV_DEPLOYMENT: Final = "HOTLOAD_DEPLOYMENT"
ENV_ROOT: Final = "HOTLOAD_ROOT"
ENV_ENGINE_HOST: Final = "HOTLOAD_ENGINE_HOST"
"""Where the engine listens and the sidecar reaches it: set in both containers."""
ENGINE_HOST: Final = "127.0.0.1"
"""The engine's address in a rendered pod: the pod's loopback, so that its admin routes
are reachable from inside the pod only (docs/security.md). The local pod runtime, whose
pods share one network namespace, gives each pod its own IP here instead."""

SIDECAR_PORT: Final = 8480
REFERENCE_ENGINE_PORT: Final = 8000
STAGING_MOUNT_PATH: Final = "/var/lib/hotload/staging"
STAGING_VOLUME: Final = "staging"

#: Header naming the policy that produced a response.
POLICY_HEADER: Final = "x-hotload-policy"
#: Header clients use to keep a multi-turn session on one replica.
SESSION_HEADER: Final = "x-multi-turn-session-id"

#: The sidecar's RBAC rules (namespaced Role), used by tests now and the operator and chart
#: later. RBAC cannot say "own pod only": a ValidatingAdmissionPolicy on the pod-bound
#: token's pod-name claim narrows pod writes to the caller's own pod.
SIDECAR_RBAC_RULES: Final[tuple[dict[str, list[str]], ...]] = (
    {
        "apiGroups": ["hotload.dev"],
        "resources": ["rolloutdeployments"],
        "verbs": ["get", "list", "watch"],
    },
    # watch: its own pod, by name (RBAC cannot narrow it to the caller's pod); patch: the
    # sidecars before the report went to pods/status alone wrote annotations there.
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch", "watch"]},
    {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get", "patch"]},
)

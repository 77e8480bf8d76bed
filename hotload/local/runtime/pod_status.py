"""The runtime's part of a pod's status, computed from its containers (pure).

Pod status has two writers (CONTRACTS.md): the runtime owns phase, IPs, startTime,
containerStatuses and the conditions ``PodReadyToStartContainers``, ``Initialized``,
``ContainersReady`` and ``Ready``; the sidecar owns ``hotload.dev/SnapshotReady``. The
patch built here is a strategic merge of ``pods/status`` that names only our own
condition types (conditions merge by ``type``), so the sidecar's condition is never
replaced. ``Ready`` = every container ready AND every ``readinessGates`` condition True,
read from the pod as the sidecar last wrote it; the runtime never writes a gate.

Level-triggered: :func:`status_differs` compares what the API server holds with what the
runtime wants there, so a difference someone else made (the controller-manager marking a
pod ``Ready=False`` while the node lease lapsed during an API server outage, a user's
patch) is repaired, not only the runtime's own transitions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from hotload.local.runtime.container import ContainerView

OWN_CONDITIONS: Final = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")
TERMINAL_PHASES: Final = ("Succeeded", "Failed")


def pod_phase(views: Sequence[ContainerView], restart_policy: str, previous: str | None) -> str:
    """The kubelet's phase rule, over the runtime's view of each container."""
    if previous in TERMINAL_PHASES:
        return previous
    waiting = running = stopped = succeeded = 0
    for view in views:
        if "running" in view.state:
            running += 1
        elif "terminated" in view.state or "terminated" in view.last_state:
            stopped += 1
            code = view.terminated_code
            if code == 0:
                succeeded += 1
        else:
            waiting += 1
    if waiting > 0 or not views:
        return "Pending"
    if running > 0:
        return "Running"
    if restart_policy == "Always":
        return "Running"
    if restart_policy == "OnFailure":
        return "Succeeded" if stopped == succeeded else "Running"
    return "Succeeded" if stopped == succeeded else "Failed"


def _condition(
    existing: Mapping[str, Mapping[str, Any]],
    kind: str,
    ok: bool,
    now: str,
    reason: str = "",
    message: str = "",
) -> dict[str, Any]:
    status = "True" if ok else "False"
    previous = existing.get(kind)
    moved = previous is None or previous.get("status") != status
    condition: dict[str, Any] = {
        "type": kind,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": now
        if moved or not previous
        else previous.get("lastTransitionTime", now),
    }
    # A strategic merge keeps fields the patch leaves out: null removes a stale reason.
    condition["reason"] = reason if not ok and reason else None
    condition["message"] = message if not ok and reason else None
    return condition


def gates_state(pod: Mapping[str, Any]) -> tuple[bool, str]:
    """(every readiness gate True, a message naming the first one that is not)."""
    conditions = {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}
    for gate in pod.get("spec", {}).get("readinessGates") or []:
        kind = gate.get("conditionType")
        condition = conditions.get(kind)
        if condition is None:
            return False, f'corresponding condition of pod readiness gate "{kind}" does not exist.'
        if condition.get("status") != "True":
            actual = condition.get("status")
            return False, f'the status of pod readiness gate "{kind}" is not "True", but {actual}'
    return True, ""


def is_ready(pod: Mapping[str, Any], views: Sequence[ContainerView]) -> bool:
    """What the runtime's ``Ready`` says (containers ready and every gate True)."""
    return bool(views) and all(v.ready for v in views) and gates_state(pod)[0]


def status_patch(
    pod: Mapping[str, Any],
    views: Sequence[ContainerView],
    *,
    pod_ip: str,
    host_ip: str,
    start_time: str,
    now: str,
    initialized: tuple[bool, str] = (True, ""),
    written: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The strategic-merge body for ``pods/status``: the runtime's fields only.

    ``written`` holds the conditions this runtime last wrote, which win over the pod's
    copy until the watch brings our own write back (so transition times stay put).
    """
    spec = pod.get("spec", {})
    status = pod.get("status") or {}
    existing = {c.get("type"): c for c in status.get("conditions") or []}
    existing.update(written or {})
    unready = [v.name for v in views if not v.ready]
    containers_ready = not unready and bool(views)
    gates_ok, gates_message = gates_state(pod)
    ready = containers_ready and gates_ok
    if not containers_ready:
        ready_reason, ready_message = (
            "ContainersNotReady",
            f"containers with unready status: [{' '.join(unready)}]",
        )
    else:
        ready_reason, ready_message = "ReadinessGatesNotReady", gates_message
    init_ok, init_message = initialized
    conditions = [
        _condition(existing, "PodReadyToStartContainers", True, now),
        _condition(existing, "Initialized", init_ok, now, "ContainersNotInitialized", init_message),
        _condition(
            existing, "ContainersReady", containers_ready, now, "ContainersNotReady", ready_message
        ),
        _condition(existing, "Ready", ready, now, ready_reason, ready_message),
    ]
    body: dict[str, Any] = {
        "phase": pod_phase(views, str(spec.get("restartPolicy", "Always")), status.get("phase")),
        "podIP": pod_ip,
        # podIPs/hostIPs merge by ip: replace the lists, never append a second address.
        "podIPs": [{"ip": pod_ip}, {"$patch": "replace"}],
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}, {"$patch": "replace"}],
        "startTime": start_time,
        "containerStatuses": [view.as_status() for view in views],
        "conditions": conditions,
    }
    generation = pod.get("metadata", {}).get("generation")
    if generation is not None:
        body["observedGeneration"] = generation
    return {"status": body}


def _holds(wanted: Any, held: Any) -> bool:
    """Whether ``held`` (the server's copy) carries every value of ``wanted`` (ours).

    Fields we leave out are the server's business (defaults it adds); ``None`` in ours
    means absent; list items that are patch directives (``{"$patch": ...}``) are skipped."""
    if isinstance(wanted, Mapping):
        if not isinstance(held, Mapping):
            return False
        return all(
            _holds(value, held.get(key))
            for key, value in wanted.items()
            if not str(key).startswith("$")
        )
    if isinstance(wanted, list):
        items = [item for item in wanted if not (isinstance(item, Mapping) and "$patch" in item)]
        if not isinstance(held, list) or len(held) != len(items):
            return False
        return all(_holds(item, other) for item, other in zip(items, held, strict=True))
    if wanted is None:
        return held is None
    return bool(wanted == held)


def status_differs(pod: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
    """True when the pod as the server holds it lacks part of the runtime's status patch
    ``body`` (conditions compared by type; transition and probe times ignored)."""
    wanted = dict(body.get("status") or {})
    held = dict(pod.get("status") or {})
    conditions = wanted.pop("conditions", [])
    by_type = {c.get("type"): c for c in held.get("conditions") or []}
    for condition in conditions:
        other = by_type.get(condition["type"])
        if other is None:
            return True
        for key in ("status", "reason", "message"):
            if condition.get(key) != other.get(key):
                return True
    wanted.pop("observedGeneration", None)
    return not _holds(wanted, held)

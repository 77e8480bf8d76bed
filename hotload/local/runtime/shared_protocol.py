"""The pipe between the runtime and a shared-mode host: one JSON object a line.

The runtime writes ``start`` (a pod's agent, with the environment its sidecar container
would have had) and ``stop``; the host answers ``started`` and ``exited`` (with an exit
code: 0 when the agent ended on request, 1 when it failed). The pipe is private to
the two processes; secrets in an environment cross it but are never logged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hotload.errors import LocalRegionError


@dataclass(frozen=True)
class StartAgent:
    uid: str
    pod: str
    """``namespace/name``, for logs."""
    env: Mapping[str, str] = field(repr=False)


@dataclass(frozen=True)
class StopAgent:
    uid: str
    grace_s: float


@dataclass(frozen=True)
class AgentStarted:
    uid: str


@dataclass(frozen=True)
class AgentExited:
    uid: str
    code: int
    error: str = ""


Command = StartAgent | StopAgent
Event = AgentStarted | AgentExited


def encode(message: Command | Event) -> bytes:
    body: dict[str, Any]
    if isinstance(message, StartAgent):
        body = {"op": "start", "uid": message.uid, "pod": message.pod, "env": dict(message.env)}
    elif isinstance(message, StopAgent):
        body = {"op": "stop", "uid": message.uid, "grace_s": message.grace_s}
    elif isinstance(message, AgentStarted):
        body = {"event": "started", "uid": message.uid}
    else:
        body = {"event": "exited", "uid": message.uid, "code": message.code, "error": message.error}
    return (json.dumps(body) + "\n").encode()


def decode_command(line: bytes) -> Command:
    body = _parse(line)
    if body.get("op") == "start":
        return StartAgent(str(body["uid"]), str(body["pod"]), dict(body["env"]))
    if body.get("op") == "stop":
        return StopAgent(str(body["uid"]), float(body["grace_s"]))
    raise LocalRegionError("unknown command on the shared host's pipe", line=line[:200])


def decode_event(line: bytes) -> Event:
    body = _parse(line)
    if body.get("event") == "started":
        return AgentStarted(str(body["uid"]))
    if body.get("event") == "exited":
        return AgentExited(str(body["uid"]), int(body["code"]), str(body.get("error", "")))
    raise LocalRegionError("unknown event on the shared host's pipe", line=line[:200])


def _parse(line: bytes) -> dict[str, Any]:
    try:
        body = json.loads(line)
    except ValueError as err:
        raise LocalRegionError("malformed line on the shared host's pipe") from err
    if not isinstance(body, dict):
        raise LocalRegionError("malformed line on the shared host's pipe")
    return body

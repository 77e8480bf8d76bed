"""Name the policy that produced every response and every streamed chunk.

CONTRACTS.md, "Policy identity on the wire": the front rewrites ``model`` to
``<servedName>@<identity>`` in every JSON response and in every Server-Sent-Events chunk.
The identity comes from the engine when it says (``Engine.identities_of``: the reference
engine and vLLM/SGLang name the weight version per response or chunk), else from what the
agent serves at that moment. A response that spans a swap (ASYNC) names the newest
identity in ``model``; the stream's chunks say where it changed, in order.

The engine's word is taken over the agent's only where the engine cannot be wrong about
it: the reference engine (``rollback_trusted``) names exactly the weights it swapped in,
even before the agent confirmed them. SGLang and vLLM keep a label over weights a failed
load left unknown, so their labels count only where the agent confirmed that identity
while the request ran (an ASYNC swap's two identities); any other label is replaced by the
agent's own, and with nothing confirmed (weights unknown, a restarted sidecar not yet
sure) no policy is named: ``model`` is the bare served name.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from hotload.api.kinds import Identity

#: Identities that produced one payload, oldest first (empty: the engine did not say).
IdentitiesOf = Callable[[Mapping[str, Any]], list[str]]


def policy_model(served_name: str, identity: Identity) -> str:
    """The ``model`` value that names a policy: ``<servedName>@<identity>``."""
    return f"{served_name}@{identity}"


class PolicyLabeler:
    """Rewrites ``model`` in JSON payloads, remembering the identities seen, in order."""

    def __init__(
        self,
        served_name: str,
        identities_of: IdentitiesOf,
        fallback: Callable[[], str | None],
        *,
        trust_engine: bool = True,
    ) -> None:
        self.served_name = served_name
        self._identities_of = identities_of
        self._fallback = fallback
        self._trust_engine = trust_engine
        self._confirmed: set[str] = set()
        """What the agent confirmed at some moment while this request ran."""
        self._current()
        self.seen: list[str] = []
        """Distinct identities in the order they produced output (a stream's history)."""

    def _current(self) -> str | None:
        confirmed = self._fallback()
        if confirmed:
            self._confirmed.add(confirmed)
        return confirmed

    def identities(self, payload: Mapping[str, Any]) -> list[str]:
        confirmed = self._current()
        named = [i for i in self._identities_of(payload) if i]
        if not self._trust_engine:
            named = [i for i in named if i in self._confirmed]
        if named:
            return named
        return [confirmed] if confirmed else []

    def label(self, payload: Any) -> Any:
        """``payload`` with ``model`` naming its policy, or the bare served name when none
        is known (non-objects pass unchanged)."""
        if not isinstance(payload, dict):
            return payload
        identities = self.identities(payload)
        for identity in identities:
            if not self.seen or self.seen[-1] != identity:
                self.seen.append(identity)
        if "model" in payload or "choices" in payload:
            payload["model"] = (
                policy_model(self.served_name, identities[-1]) if identities else self.served_name
            )
        return payload

    def label_json(self, body: bytes) -> bytes:
        """A whole JSON response body, relabelled (a body that is not JSON passes as is)."""
        try:
            payload = json.loads(body)
        except ValueError:
            return body
        return json.dumps(self.label(payload), separators=(",", ":")).encode()


class SseRelabeler:
    """Relabels a Server-Sent-Events byte stream chunk by chunk, whatever the splits.

    Events end at a blank line; each ``data:`` line holding a JSON object gets its
    ``model`` rewritten; ``data: [DONE]``, comments and other fields pass unchanged.
    """

    def __init__(self, labeler: PolicyLabeler) -> None:
        self.labeler = labeler
        self._buffer = b""

    def feed(self, data: bytes) -> bytes:
        """Bytes of every event completed by ``data``, relabelled."""
        self._buffer += data.replace(b"\r\n", b"\n")
        out: list[bytes] = []
        while True:
            end = self._buffer.find(b"\n\n")
            if end < 0:
                break
            event, self._buffer = self._buffer[:end], self._buffer[end + 2 :]
            out.append(self._event(event) + b"\n\n")
        return b"".join(out)

    def flush(self) -> bytes:
        """Whatever is left at the end of the stream (an unterminated last event)."""
        rest, self._buffer = self._buffer, b""
        return self._event(rest) if rest.strip() else rest

    def _event(self, event: bytes) -> bytes:
        lines = event.split(b"\n")
        for index, line in enumerate(lines):
            if not line.startswith(b"data:"):
                continue
            value = line[5:].strip()
            if not value.startswith(b"{"):
                continue
            try:
                payload = json.loads(value)
            except ValueError:
                continue
            labelled = json.dumps(self.labeler.label(payload), separators=(",", ":"))
            lines[index] = b"data: " + labelled.encode()
        return b"\n".join(lines)

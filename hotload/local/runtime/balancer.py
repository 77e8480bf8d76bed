"""Which Ready pod gets a request: round robin, with session affinity on a header.

Requests carrying ``x-multi-turn-session-id`` stick to the pod that served the session
first for as long as that pod stays among the Ready backends; then the session moves
to the next pod in turn and sticks there. Sessions are remembered up to a bound
(least recently used forgotten first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from hotload.local.runtime.service_table import Backend


class Balancer:
    def __init__(self, max_sessions: int = 100_000) -> None:
        self._next = 0
        self._sessions: OrderedDict[str, str] = OrderedDict()
        self._max_sessions = max_sessions

    def order(self, backends: Sequence[Backend], session: str | None) -> list[Backend]:
        """Backends to try, best first (the next ones are for a refused connection)."""
        if not backends:
            return []
        ordered = sorted(backends, key=lambda b: b.pod)
        if session is not None:
            pinned = self._sessions.get(session)
            for position, backend in enumerate(ordered):
                if backend.pod == pinned:
                    self._sessions.move_to_end(session)
                    return ordered[position:] + ordered[:position]
        start = self._next % len(ordered)
        self._next += 1
        rotated = ordered[start:] + ordered[:start]
        if session is not None:
            self.pin(session, rotated[0])
        return rotated

    def pin(self, session: str, backend: Backend) -> None:
        """Remember that ``session`` goes to ``backend`` (the one that answered)."""
        self._sessions[session] = backend.pod
        self._sessions.move_to_end(session)
        while len(self._sessions) > self._max_sessions:
            self._sessions.popitem(last=False)

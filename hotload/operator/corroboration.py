"""Whether the operator believes a replica's report of what it serves: a pure function.

A pod's annotations are written by its sidecar, but anyone with ``patch`` on pods can write
them too; a Ready latch is final. So a replica counts toward a snapshot's Ready only when
its report is corroborated (CONTRACTS.md, "The pod report"; docs/operator.md):

- **Digest.** The report carries ``hotload.dev/digest`` (the weights digest its sidecar
  verified of what the engine serves) and the snapshot declares the digest its rebuilt
  weights must have (``spec.digest``, written by the trainer's publisher): equal, the
  replica counts at once; different, it is ``Disputed`` and never counts while so.
- **Agreement.** With no declared digest, replicas reporting the same snapshot must report
  the same digest: any disagreement disputes them all, until it is resolved.
- **Standing.** A report with nothing to compare its digest with, or with no digest at all
  (the engine offers none: SGLang and vLLM without ``verifyDigest``), counts only once it
  has stood unchanged for :data:`REPORT_STANDS_S` since the operator first saw it: longer
  than a sidecar takes to repair, on its own pod, a report it did not write (5 s). Never on
  the pod's word alone; the ledger entry says which way it was believed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from hotload.api.kinds import Identity
from hotload.api.policy_snapshot import Corroboration
from hotload.operator.pods import PodReport

REPORT_STANDS_S: Final = 6.0
"""How long a report with nothing to compare must stand unchanged before it counts (the
sidecar repairs a report it did not write within 5 s)."""


@dataclass(frozen=True)
class Corroborations:
    by_pod: dict[str, Corroboration]
    """Pod name → how its report of what it serves is believed (pods serving nothing: absent)."""
    recheck_at: datetime | None
    """When the first pending report will have stood long enough (plan again then)."""

    def of(self, pod: PodReport) -> Corroboration | None:
        return self.by_pod.get(pod.name)


def corroborate(
    pods: Iterable[PodReport],
    declared: Mapping[Identity, str | None],
    now: datetime,
    stands_s: float = REPORT_STANDS_S,
) -> Corroborations:
    """How each pod's report of the snapshot it serves is believed now."""
    serving = [pod for pod in pods if pod.served_identity]
    reported: dict[Identity, set[str]] = {}
    for pod in serving:
        if pod.digest and pod.served_identity:
            reported.setdefault(pod.served_identity, set()).add(pod.digest)
    by_pod: dict[str, Corroboration] = {}
    recheck: datetime | None = None
    for pod in serving:
        identity = pod.served_identity or ""
        expected = declared.get(identity)
        if pod.digest and expected:
            by_pod[pod.name] = (
                Corroboration.DIGEST if pod.digest == expected else Corroboration.DISPUTED
            )
            continue
        if pod.digest and len(reported.get(identity, ())) > 1:
            by_pod[pod.name] = Corroboration.DISPUTED
            continue
        stands_at = (pod.first_seen or now) + timedelta(seconds=stands_s)
        if pod.first_seen is not None and stands_at <= now:
            by_pod[pod.name] = Corroboration.STOOD
        else:
            by_pod[pod.name] = Corroboration.PENDING
            recheck = stands_at if recheck is None else min(recheck, stands_at)
    return Corroborations(by_pod, recheck)


def counts(corroboration: Corroboration | None) -> bool:
    """True when a report so believed counts toward Ready."""
    return corroboration in (Corroboration.DIGEST, Corroboration.STOOD)

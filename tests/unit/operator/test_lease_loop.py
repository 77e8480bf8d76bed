"""The leader election's loop outlives a round that fails in a way nobody foresaw.

Would catch: an exception other than a mapped Kubernetes error (a malformed answer, a bug
in a round) ending the Lease task while the process lives on, healthy by its probes: a
standby that never takes over, a leader that never renews. The Lease's own rules run
against a real apiserver in tests/integration/operator/test_leader_lease.py.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from hotload.operator.lease import LeaderLease, LeaseTiming


async def test_a_round_that_raises_is_logged_and_the_next_round_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lease = LeaderLease(
        lambda: Any, "ns", "leader", "pod_1", LeaseTiming(duration_s=1.0, renew_s=0.2, poll_s=0.01)
    )
    rounds: list[int] = []
    again = asyncio.Event()

    async def flaky_round() -> None:
        rounds.append(len(rounds))
        if len(rounds) == 1:
            raise ValueError("an answer nobody foresaw")
        again.set()

    lease._try_acquire = flaky_round  # type: ignore[method-assign]
    task = asyncio.create_task(lease.run())
    try:
        with caplog.at_level(logging.ERROR, logger="hotload.operator.lease"):
            await asyncio.wait_for(again.wait(), timeout=10)
    finally:
        task.cancel()
    assert len(rounds) >= 2
    assert any(r.message == "leader Lease round failed" and r.exc_info for r in caplog.records)

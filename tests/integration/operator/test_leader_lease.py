"""The leader Lease against a real apiserver: one holder at a time, fenced by its own clock.

Short timings (a 3 s Lease) so the story takes seconds; the chart's operators use the
defaults (tests/integration/operator/test_fencing.py freezes a real one).

Would catch: two holders at once, a holder whose tenure outlives its last renewal (a
frozen leader that resumes and writes), a restarted process resuming its predecessor's
tenure or preempting a live holder, a clean stop that leaves the standby waiting a whole
Lease duration, a write sent without holding the Lease, a reconciler that saw its tenure
lapse while the process's loop was busy and then waits forever on a Lease still renewed, a
process started beside a clean stop taking the released Lease before the warm standby.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio.client import ApiClient

from hotload.errors import NotLeader
from hotload.kube import async_api_client
from hotload.local import LocalRegions
from hotload.operator.executor import KubeExecutor
from hotload.operator.lease import LeaderLease, LeaseTiming
from hotload.operator.metrics import OperatorMetrics
from hotload.operator.plan import EventSpec, EventType

TIMING = LeaseTiming(duration_s=3.0, renew_s=0.5, poll_s=0.2)
NAME = "leader"


@pytest.fixture
async def api(local_regions: LocalRegions) -> AsyncIterator[ApiClient]:
    client = await async_api_client(local_regions.kubeconfig, context=local_regions.regions[0].name)
    try:
        yield client
    finally:
        await client.close()


def lease(api: ApiClient, namespace: str, identity: str) -> LeaderLease:
    return LeaderLease(lambda: api, namespace, NAME, identity, TIMING)


async def test_one_holder_a_silent_holder_loses_its_fence_first_and_a_restart_yields(
    api: ApiClient, namespace: str
) -> None:
    first = lease(api, namespace, "op-0_aaaa")
    second = lease(api, namespace, "op-1_bbbb")
    running = {"first": asyncio.create_task(first.run())}
    try:
        await asyncio.wait_for(first.wait_leading(), 10)
        running["second"] = asyncio.create_task(second.run())
        await asyncio.sleep(TIMING.duration_s * 1.5)  # renewed throughout: nobody takes over
        assert first.leading and not second.leading
        fence = first.fence()
        assert fence is not None

        # The holder falls silent (what SIGSTOP does to its renewals): the other takes
        # over, and by then the silent one's own clock has ended its tenure.
        running["first"].cancel()
        await asyncio.wait_for(second.wait_leading(), 10)
        with pytest.raises(NotLeader):
            first.fence()
        taken = second.fence()
        assert taken is not None and taken.epoch == fence.epoch + 1
        executor = KubeExecutor(api, OperatorMetrics(), "op-0", leadership=first)
        event = EventSpec("RolloutDeployment", "x", "uid", EventType.NORMAL, "Test", "never sent")
        with pytest.raises(NotLeader):
            await executor.emit(namespace, event)

        # The first pod's container restarts: a new incarnation, a candidate like any other.
        restarted = lease(api, namespace, "op-0_cccc")
        running["restarted"] = asyncio.create_task(restarted.run())
        await asyncio.sleep(TIMING.duration_s * 1.5)
        assert second.leading and not restarted.leading

        # A clean stop hands the Lease over at once (well within one duration).
        running["second"].cancel()
        await second.release()
        await asyncio.wait_for(restarted.wait_leading(), TIMING.duration_s * 0.8)
        assert restarted.fence() is not None
    finally:
        for task in running.values():
            task.cancel()
        await asyncio.gather(*running.values(), return_exceptions=True)


async def test_a_released_lease_goes_to_the_standby_not_to_a_process_just_started(
    api: ApiClient, namespace: str
) -> None:
    """A Deployment replaces its deleted leader: the new pod starts as the old one stops
    cleanly. The standby, watching all along, takes the released Lease; the newcomer
    becomes the next standby."""
    holder = lease(api, namespace, "op-0_eeee")
    standby = lease(api, namespace, "op-1_ffff")
    running = {"holder": asyncio.create_task(holder.run())}
    try:
        await asyncio.wait_for(holder.wait_leading(), 10)
        running["standby"] = asyncio.create_task(standby.run())
        newcomer = lease(api, namespace, "op-2_gggg")
        await asyncio.sleep(TIMING.duration_s * 1.2)  # the standby has watched a whole term
        assert holder.leading and not standby.leading
        # The replacement starts while the leader shuts down (it has been reading the Lease
        # for a while when the release comes).
        running["newcomer"] = asyncio.create_task(newcomer.run())
        await asyncio.sleep(TIMING.newcomer_wait_s * 2)

        running["holder"].cancel()
        await holder.release()
        await asyncio.wait_for(standby.wait_leading(), TIMING.duration_s * 0.8)
        await asyncio.sleep(TIMING.newcomer_wait_s * 2)  # the newcomer has looked again
        assert standby.leading and not newcomer.leading
    finally:
        for task in running.values():
            task.cancel()
        await asyncio.gather(*running.values(), return_exceptions=True)


async def test_a_waiter_that_saw_a_lapse_resumes_when_a_late_renewal_succeeds(
    api: ApiClient, namespace: str
) -> None:
    """The event loop blocked past the tenure's validity (a large LIST parsed, a loaded
    machine): the reconciler sees the tenure lapse and waits; the next renewal still
    succeeds (nobody took the Lease meanwhile), and the waiter must lead again."""
    holder = lease(api, namespace, "op-0_dddd")
    running = asyncio.create_task(holder.run())
    resumed: list[int] = []

    async def reconciler() -> None:
        while True:
            tenure = await holder.wait_leading()
            resumed.append(tenure)
            while holder.leading and holder.tenure == tenure:
                await asyncio.sleep(0.05)

    waiting = asyncio.create_task(reconciler())
    try:
        await asyncio.wait_for(holder.wait_leading(), 10)
        for _ in range(100):  # the reconciler is in its tenure
            if resumed:
                break
            await asyncio.sleep(0.05)
        assert len(resumed) == 1
        time.sleep(TIMING.duration_s - TIMING.renew_s + 0.3)  # the loop blocked past validity
        for _ in range(int(TIMING.duration_s * 2 / 0.05)):
            if len(resumed) == 2 and holder.leading:
                break
            await asyncio.sleep(0.05)
        assert holder.leading, "the Lease is renewed after the stall"
        assert len(resumed) == 2, "the reconciler that saw the lapse leads again"
    finally:
        for task in (running, waiting):
            task.cancel()
        await asyncio.gather(running, waiting, return_exceptions=True)

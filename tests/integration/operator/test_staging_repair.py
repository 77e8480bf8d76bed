"""A delta broken in one replica's staging only: that replica replays, the chain stays valid.

Needs the sidecar's rule (CONTRACTS "What the sidecar writes"): a chain-breaking reason is
reported only after a replay from the last Full, fetched again, failed too.
"""

from __future__ import annotations

from hotload.local import LocalRegions
from tests.integration.operator.conftest import Rollout


def test_a_delta_broken_in_one_replicas_staging_only_is_repaired_without_marking_the_chain(
    rollout: Rollout, operated_regions: LocalRegions
) -> None:
    """Would catch: one replica's bad staging taken for a bad bucket (a chain marked broken,
    the whole deployment Degraded) instead of that replica replaying from the last Full."""
    region = next(r for r in operated_regions.regions if r.name == rollout.region)
    rollout.create(replicas=2)
    s0 = rollout.publish(0, full=True)
    s1 = rollout.publish(1)
    rollout.wait_ready(s0.identity, s1.identity)
    # Every rebuilt copy fleet-0 holds (both staging buffers): whatever it builds the next
    # snapshot from locally is bad, and only fleet-0's.
    pods = region.directory / "runtime" / "pods"
    staged = sorted(pods.glob(f"{rollout.namespace}_fleet-0_*/volumes/staging/buffers/*/*/"
                              "*.safetensors"))  # fmt: skip
    assert staged, "fleet-0 holds no rebuilt snapshot in its staging buffers"
    for path in staged:
        data = bytearray(path.read_bytes())
        data[-1] ^= 0x01  # the last byte of tensor data
        path.write_bytes(bytes(data))
    s2 = rollout.publish(2)
    rollout.wait_ready(s2.identity)
    assert rollout.condition(rollout.snapshot(s2.identity), "ChainValid")[0] == "True"
    assert rollout.condition(rollout.deployment(), "Degraded")[0] == "False"
    assert rollout.all_serve(s2.identity, 2)
    via = {
        pod.metadata.name: (pod.metadata.annotations or {}).get("hotload.dev/via")
        for pod in rollout.pods()
    }
    assert via["fleet-1"] == "delta", via  # the healthy replica applied the delta
    assert via["fleet-0"] in ("replay", "full"), via  # the damaged one did not trust its copy

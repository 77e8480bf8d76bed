"""Full or Incremental, and the names snapshots get: the publisher's cadence rules.

Would catch: a delta published on top of a broken chain, a Full skipped at its cadence,
a delta at the same step as its base, a fallback Full named like the delta it replaces.
"""

from __future__ import annotations

import pytest

from hotload.api import SnapshotKind
from hotload.errors import ConfigError
from hotload.publish.cadence import (
    Previous,
    check_prefix,
    checkpoint_identity_for,
    decide,
    identity_for,
)

FULL, DELTA, LORA = SnapshotKind.FULL, SnapshotKind.INCREMENTAL, SnapshotKind.LORA


def previous(step: int, kind: SnapshotKind = DELTA, last_full: int = 0) -> Previous:
    return Previous(identity=f"p-step-{step}", step=step, kind=kind, last_full_step=last_full)


@pytest.mark.parametrize(
    ("step", "before", "flags", "kind", "why"),
    [
        (0, None, {}, FULL, "first"),
        (7, None, {"requested_full": True}, FULL, "first"),
        (1, previous(0, FULL), {}, DELTA, "delta"),
        (24, previous(23), {}, DELTA, "delta"),
        (25, previous(24), {}, FULL, "cadence"),
        (30, previous(24), {}, FULL, "cadence"),
        (26, previous(25, FULL, last_full=25), {}, DELTA, "delta"),
        (3, previous(2), {"requested_full": True}, FULL, "requested"),
        (3, previous(2), {"chain_broken": True}, FULL, "chain-broken"),
        (2, previous(2), {"chain_broken": True}, FULL, "chain-broken"),
        (3, previous(2), {"lora": True}, LORA, "lora"),
        (3, previous(2, LORA, last_full=2), {}, FULL, "first"),
    ],
)
def test_decision_follows_the_rules_in_order(
    step: int, before: Previous | None, flags: dict[str, bool], kind: SnapshotKind, why: str
) -> None:
    decision = decide(step=step, previous=before, full_every=25, **flags)
    assert (decision.kind, decision.why) == (kind, why)
    assert decision.previous == (before.identity if kind is DELTA and before else None)


@pytest.mark.parametrize(
    ("step", "before", "flags", "kind", "why"),
    [
        (0, None, {}, FULL, "first"),
        (24, previous(23), {}, DELTA, "delta"),
        (25, previous(24), {}, DELTA, "checkpoint"),
        (30, previous(24), {}, DELTA, "checkpoint"),
        (26, previous(25, DELTA, last_full=25), {}, DELTA, "delta"),
        # Only the cadence goes beside the chain: a broken chain or a request is a Full.
        (25, previous(24), {"chain_broken": True}, FULL, "chain-broken"),
        (25, previous(24), {"requested_full": True}, FULL, "requested"),
        # No delta on a LoRA, due or not.
        (25, previous(24, LORA, last_full=0), {}, FULL, "first"),
    ],
)
def test_with_checkpoints_the_cadence_is_a_delta_with_a_full_beside_it(
    step: int, before: Previous | None, flags: dict[str, bool], kind: SnapshotKind, why: str
) -> None:
    decision = decide(step=step, previous=before, full_every=25, checkpoints=True, **flags)
    assert (decision.kind, decision.why) == (kind, why)
    assert decision.checkpoint == (why == "checkpoint")
    assert decision.previous == (before.identity if kind is DELTA and before else None)


def test_a_checkpoint_is_never_named_like_a_full_of_its_step() -> None:
    assert checkpoint_identity_for("run-7", 12) == "run-7-step-12-checkpoint"
    assert checkpoint_identity_for("run-7", 12) != identity_for("run-7", 12, FULL)


def test_full_every_one_makes_every_snapshot_a_full() -> None:
    assert decide(step=1, previous=previous(0, FULL), full_every=1).kind is FULL


def test_a_step_older_than_the_last_is_refused() -> None:
    with pytest.raises(ConfigError, match="forward"):
        decide(step=4, previous=previous(5), full_every=25)


def test_a_delta_at_the_same_step_is_refused_but_a_full_is_fine() -> None:
    with pytest.raises(ConfigError, match="same step"):
        decide(step=5, previous=previous(5), full_every=25)
    assert decide(step=5, previous=previous(5), full_every=25, requested_full=True).kind is FULL


def test_full_every_must_be_positive() -> None:
    with pytest.raises(ConfigError):
        decide(step=1, previous=None, full_every=0)


def test_identities_tell_kinds_apart() -> None:
    assert identity_for("run-7", 12, DELTA) == "run-7-step-12"
    assert identity_for("run-7", 12, FULL) == "run-7-step-12-full"
    assert identity_for("run-7", 12, LORA) == "run-7-step-12-lora"


@pytest.mark.parametrize("prefix", ["", "Run", "run_7", "-run", "run-", "a" * 201])
def test_prefixes_that_would_make_invalid_identities_are_refused(prefix: str) -> None:
    with pytest.raises(ConfigError, match="prefix"):
        check_prefix(prefix)

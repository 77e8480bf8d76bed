"""Full or Incremental: the publisher's choice for each step, and the names it gives.

A pure function of what was published before, so it is tested with tables of cases. The
rules, in order (the first that applies wins):

1. a LoRA adapter is always complete (``lora``);
2. nothing was published before, or its weights are gone (``first``);
3. the caller asked for a Full (``requested``);
4. a region reported ``ChainValid=False`` on a snapshot of the current chain
   (``chain-broken``): only a Full resets a broken chain;
5. ``full_every`` steps or more since the last Full (``cadence``); with ``checkpoints``,
   a delta instead, whose weights also go out as a Full *beside* the chain
   (``checkpoint``; docs/snapshot-format.md, "Checkpoints (v5)"), so the deltas never wait
   behind a Full on a slow link;
6. else a delta against the previous snapshot (``delta``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from hotload.api import IDENTITY_PATTERN, SnapshotKind
from hotload.errors import ConfigError

DEFAULT_FULL_EVERY: Final = 25
#: Room left in an identity (≤ 253) for ``-step-<n>-full``.
MAX_PREFIX_LENGTH: Final = 200


@dataclass(frozen=True)
class Previous:
    """The last snapshot published (the base of the next delta)."""

    identity: str
    step: int
    kind: SnapshotKind
    last_full_step: int
    """Step of the newest Full (or LoRA) in its chain, or of the newest checkpoint begun."""


@dataclass(frozen=True)
class Decision:
    kind: SnapshotKind
    why: str
    previous: str | None
    """The delta's base; None for complete snapshots."""
    checkpoint: bool = False
    """A delta whose weights also go out as a checkpoint beside the chain."""


def decide(
    *,
    step: int,
    previous: Previous | None,
    full_every: int,
    requested_full: bool = False,
    chain_broken: bool = False,
    lora: bool = False,
    checkpoints: bool = False,
) -> Decision:
    """What to publish at ``step`` (see the module's rules)."""
    if full_every < 1:
        raise ConfigError("full_every must be at least 1", full_every=full_every)
    if previous is not None and step < previous.step:
        raise ConfigError(
            "steps only move forward: this step is older than the last published one",
            step=step,
            previous_step=previous.step,
            previous=previous.identity,
        )
    if lora:
        return Decision(SnapshotKind.LORA, "lora", None)
    if previous is None:
        return Decision(SnapshotKind.FULL, "first", None)
    if requested_full:
        return Decision(SnapshotKind.FULL, "requested", None)
    if chain_broken:
        return Decision(SnapshotKind.FULL, "chain-broken", None)
    due = step - previous.last_full_step >= full_every
    if due and not checkpoints:
        return Decision(SnapshotKind.FULL, "cadence", None)
    if previous.kind is SnapshotKind.LORA:
        return Decision(SnapshotKind.FULL, "first", None)
    if step == previous.step:
        raise ConfigError(
            "a delta at the same step as the previous snapshot changes nothing; "
            "publish a Full to replace it",
            step=step,
            previous=previous.identity,
        )
    if due:
        return Decision(SnapshotKind.INCREMENTAL, "checkpoint", previous.identity, checkpoint=True)
    return Decision(SnapshotKind.INCREMENTAL, "delta", previous.identity)


def check_prefix(prefix: str) -> str:
    """An identity prefix must leave every name it makes a valid identity (DNS-1123)."""
    if not prefix or len(prefix) > MAX_PREFIX_LENGTH or not re.match(IDENTITY_PATTERN, prefix):
        raise ConfigError(
            "an identity prefix is lowercase letters, digits, '-' and '.', starting and "
            f"ending with a letter or digit, at most {MAX_PREFIX_LENGTH} characters",
            prefix=prefix,
        )
    return prefix


def checkpoint_identity_for(prefix: str, step: int) -> str:
    """``<prefix>-step-<n>-checkpoint``: the Full of step n's weights published beside the
    chain, never the same name as the in-chain Full of that step (``…-full``), which a
    broken chain may call for while the checkpoint is still on its way."""
    return f"{identity_for(prefix, step, SnapshotKind.INCREMENTAL)}-checkpoint"


def identity_for(prefix: str, step: int, kind: SnapshotKind) -> str:
    """``<prefix>-step-<n>`` for deltas, ``…-full`` / ``…-lora`` for complete snapshots,
    so the fallback Full of step n never collides with the broken delta of step n."""
    if step < 0:
        raise ConfigError("a step is a non-negative integer", step=step)
    base = f"{check_prefix(prefix)}-step-{step}"
    if kind is SnapshotKind.FULL:
        return f"{base}-full"
    if kind is SnapshotKind.LORA:
        return f"{base}-lora"
    return base

"""After a publish: record the new snapshot as the base of the next one, and drop from the
work directory what nothing needs any more (older weights; encoded snapshots no region
still has queued), then save the state."""

from __future__ import annotations

import shutil
from pathlib import Path

from hotload.api import SnapshotKind
from hotload.publish.state import LastSnapshot, PublisherState, WorkDir


def remember(
    state: PublisherState,
    identity: str,
    step: int,
    kind: SnapshotKind,
    weights: Path,
    *,
    checkpoint_begun: bool = False,
) -> None:
    """Make the new snapshot the last one and extend (or restart) the chain.
    ``checkpoint_begun``: a checkpoint of it is on its way, so the cadence counts from it."""
    last = state.last
    complete = kind is not SnapshotKind.INCREMENTAL
    restart = complete or last is None or checkpoint_begun
    last_full = step if restart or last is None else last.last_full_step
    state.last = LastSnapshot(
        identity=identity, step=step, kind=kind, last_full_step=last_full, weights=str(weights)
    )
    state.chain = [identity] if complete else [*state.chain, identity]
    if state.checkpoint is not None and state.checkpoint.of not in state.chain:
        state.checkpoint = None  # of a chain that ended: no later delta names it


def tidy(workdir: WorkDir, state: PublisherState) -> None:
    """Remove what the state no longer references, then save the state."""
    keep_weights = {state.last.weights} if state.last else set()
    keep_encoded = state.referenced_encoded()
    pending = state.checkpoint_pending
    if pending is not None:  # its lane reads the weights and writes the encoded Full
        keep_weights.add(pending.weights)
        keep_encoded.add(str(workdir.encoded(pending.identity)))
    for parent, keep in (
        (workdir.weights("x").parent, keep_weights),
        (workdir.encoded("x").parent, keep_encoded),
    ):
        if parent.is_dir():
            for child in parent.iterdir():
                if str(child) not in keep:
                    shutil.rmtree(child, ignore_errors=True)
    workdir.save(state)

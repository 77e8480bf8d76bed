"""The chain planner, as a table of situations a replica can be in."""

from __future__ import annotations

import pytest

from hotload.api import LoadPath, SnapshotKind
from hotload.errors import ChainBroken, NotFound
from hotload.snapshot import (
    Manifest,
    ManifestCheckpoint,
    StoredFile,
    TensorEntry,
    manifest_digest,
    next_manifest_needed,
    plan_update,
    plan_update_with,
)

HASH = "0" * 64


def tensors(seed: int) -> list[TensorEntry]:
    return [
        TensorEntry(
            name="w",
            dtype="BF16",
            shape=[2],
            file="model.safetensors",
            codec="stored",
            hash=f"{seed:032x}",
        )
    ]


def full(
    identity: str, step: int, size: int = 1000, kind: SnapshotKind = SnapshotKind.FULL
) -> Manifest:
    return Manifest(
        identity=identity,
        step=step,
        kind=kind,
        files=[StoredFile(path="model.safetensors", size=size, hash=HASH)],
        shards=[
            {"path": "model.safetensors", "size": size, "headerLength": 60, "headerHash": "0" * 32}
        ],
        tensors=tensors(step),
    )


def delta(
    identity: str,
    step: int,
    previous: Manifest | str,
    size: int = 10,
    *,
    previous_step: int | None = None,
) -> Manifest:
    digest = manifest_digest(previous) if isinstance(previous, Manifest) else "f" * 32
    name = previous.identity if isinstance(previous, Manifest) else previous
    entry = TensorEntry(
        name="w",
        dtype="BF16",
        shape=[2],
        file="model.safetensors",
        codec="unchanged",
        hash=f"{step:032x}",
    )
    return Manifest(
        identity=identity,
        step=step,
        kind=SnapshotKind.INCREMENTAL,
        previous=name,
        previous_digest=digest,
        deltas=[StoredFile(path="hotload-delta-00001.bin", size=size, hash=HASH)],
        shards=[
            {"path": "model.safetensors", "size": 68, "headerLength": 60, "headerHash": "0" * 32}
        ],
        tensors=[entry],
    )


F1 = full("f1", 1)
D2 = delta("d2", 2, F1)
D3 = delta("d3", 3, D2)
D4 = delta("d4", 4, D3)
CHAIN = {m.identity: m for m in (F1, D2, D3, D4)}


@pytest.mark.parametrize(
    ("held", "target", "via", "apply", "fetch"),
    [
        ("d3", "d4", LoadPath.DELTA, ("d4",), 10),
        ("d2", "d4", LoadPath.DELTA, ("d3", "d4"), 20),
        ("f1", "d4", LoadPath.DELTA, ("d2", "d3", "d4"), 30),
        (None, "d4", LoadPath.REPLAY, ("f1", "d2", "d3", "d4"), 1030),
        ("elsewhere", "d3", LoadPath.REPLAY, ("f1", "d2", "d3"), 1020),
        (None, "f1", LoadPath.FULL, ("f1",), 1000),
        ("d3", "f1", LoadPath.FULL, ("f1",), 1000),
        ("d4", "d4", LoadPath.DELTA, (), 0),
    ],
)
def test_cheapest_plan(
    held: str | None, target: str, via: LoadPath, apply: tuple[str, ...], fetch: int
) -> None:
    plan = plan_update(held, target, CHAIN)
    assert (plan.via, plan.apply, plan.fetch_bytes) == (via, apply, fetch)
    assert plan.up_to_date == (apply == ())


def test_a_delta_needs_no_manifest_of_what_the_replica_holds() -> None:
    plan = plan_update("d3", "d4", {"d4": D4})
    assert plan.apply == ("d4",)


def test_missing_manifest_is_chain_broken_naming_it() -> None:
    with pytest.raises(ChainBroken) as caught:
        plan_update(None, "d4", {"d4": D4, "d3": D3})
    assert caught.value.context["missing"] == "d2"


def test_cycle_is_chain_broken() -> None:
    a = delta("a", 5, "b")
    b = delta("b", 4, "a")
    with pytest.raises(ChainBroken, match=r"cycle|not older|other weights"):
        plan_update(None, "a", {"a": a, "b": b})


def test_pure_cycle_without_digests_is_chain_broken() -> None:
    a = delta("a", 5, "a")
    with pytest.raises(ChainBroken):
        plan_update(None, "a", {"a": a})


def test_previous_that_is_not_older_is_chain_broken() -> None:
    late = full("f9", 9)
    bad = delta("d5", 5, late)
    with pytest.raises(ChainBroken, match="not older"):
        plan_update(None, "d5", {"d5": bad, "f9": late})


def test_previous_with_other_weights_is_chain_broken() -> None:
    other = full("f1", 1).model_copy(update={"tensors": tensors(77)})
    with pytest.raises(ChainBroken, match="other weights"):
        plan_update(None, "d2", {"d2": D2, "f1": other})


def test_manifest_under_another_name_is_chain_broken() -> None:
    with pytest.raises(ChainBroken, match="another identity"):
        plan_update(None, "d2", {"d2": D2, "f1": full("f0", 1)})


def test_delta_on_a_lora_is_chain_broken() -> None:
    lora = full("l1", 1, kind=SnapshotKind.LORA)
    with pytest.raises(ChainBroken, match="LoRA"):
        plan_update(None, "d2", {"d2": delta("d2", 2, lora), "l1": lora})


def test_next_manifest_needed_walks_back_one_link_at_a_time() -> None:
    known: dict[str, Manifest] = {}
    asked = []
    while (needed := next_manifest_needed(None, "d4", known)) is not None:
        asked.append(needed)
        known[needed] = CHAIN[needed]
    assert asked == ["d4", "d3", "d2", "f1"]
    assert next_manifest_needed("d3", "d4", {"d4": D4}) is None


def test_plan_with_a_loader_fetches_only_what_it_needs() -> None:
    loaded: list[str] = []

    def load(identity: str) -> Manifest:
        loaded.append(identity)
        return CHAIN[identity]

    plan = plan_update_with("d2", "d4", load)
    assert plan.apply == ("d3", "d4") and loaded == ["d4", "d3"]


def test_loader_errors_pass_through_unchanged() -> None:
    def load(identity: str) -> Manifest:
        raise NotFound("not replicated yet", identity=identity)

    with pytest.raises(NotFound):
        plan_update_with(None, "d4", load)


# --- checkpoints (v5): a Full of a chain member's weights, published beside the chain ---


def rebuilt_full(of: Manifest, identity: str, size: int = 900) -> Manifest:
    """A Full holding exactly the rebuilt tensors of ``of`` (what the publisher uploads)."""
    return full(identity, of.step, size).model_copy(update={"tensors": of.tensors})


def naming(manifest: Manifest, checkpoint: str, of: str) -> Manifest:
    """``manifest`` (a delta) naming the checkpoint ``checkpoint`` of ``of``."""
    return Manifest.model_validate(
        {
            **manifest.model_dump(),
            "format": "hotload-delta/v5",
            "checkpoint": ManifestCheckpoint(identity=checkpoint, of=of),
        }
    )


C3 = rebuilt_full(D3, "c3")
D5 = naming(delta("d5", 5, D4), "c3", "d3")
D6 = delta("d6", 6, D5)
WITH_CHECKPOINT = {m.identity: m for m in (F1, D2, D3, D4, D5, D6, C3)}


@pytest.mark.parametrize(
    ("held", "target", "via", "apply", "fetch"),
    [
        # Holding the checkpoint's snapshot or later: the deltas, as before.
        ("d5", "d6", LoadPath.DELTA, ("d6",), 10),
        ("d4", "d6", LoadPath.DELTA, ("d5", "d6"), 20),
        ("d3", "d6", LoadPath.DELTA, ("d4", "d5", "d6"), 30),
        # Nothing, something else, or the chain before the checkpoint: from the checkpoint.
        (None, "d6", LoadPath.REPLAY, ("c3", "d4", "d5", "d6"), 930),
        ("elsewhere", "d5", LoadPath.REPLAY, ("c3", "d4", "d5"), 920),
        ("d2", "d6", LoadPath.REPLAY, ("c3", "d4", "d5", "d6"), 930),
        ("f1", "d6", LoadPath.REPLAY, ("c3", "d4", "d5", "d6"), 930),
        # A target before the delta that names the checkpoint: the old floor.
        (None, "d4", LoadPath.REPLAY, ("f1", "d2", "d3", "d4"), 1030),
    ],
)
def test_the_newest_checkpoint_is_the_chains_floor(
    held: str | None, target: str, via: LoadPath, apply: tuple[str, ...], fetch: int
) -> None:
    plan = plan_update(held, target, WITH_CHECKPOINT)
    assert (plan.via, plan.apply, plan.fetch_bytes) == (via, apply, fetch)


def test_nothing_older_than_the_checkpoints_snapshot_is_read() -> None:
    """What gc and retention may delete: the chain before ``of``, and ``of`` itself."""
    loaded: list[str] = []

    def load(identity: str) -> Manifest:
        loaded.append(identity)
        return WITH_CHECKPOINT[identity]

    plan = plan_update_with(None, "d6", load)
    assert plan.apply == ("c3", "d4", "d5", "d6")
    assert loaded == ["d6", "d5", "d4", "c3"]


def test_a_checkpoint_of_other_weights_is_chain_broken() -> None:
    other = rebuilt_full(D2, "c3")  # D2's weights, named as D3's
    with pytest.raises(ChainBroken, match="other weights") as caught:
        plan_update(None, "d6", {**WITH_CHECKPOINT, "c3": other})
    assert caught.value.context["checkpoint"] == "c3"


def test_a_checkpoint_that_is_not_a_full_is_chain_broken() -> None:
    lora = rebuilt_full(D3, "c3").model_copy(update={"kind": SnapshotKind.LORA})
    with pytest.raises(ChainBroken, match="not a Full"):
        plan_update(None, "d6", {**WITH_CHECKPOINT, "c3": lora})


def test_a_checkpoint_not_older_than_the_delta_after_it_is_chain_broken() -> None:
    late = rebuilt_full(D3, "c3").model_copy(update={"step": 4})
    with pytest.raises(ChainBroken, match="not older"):
        plan_update(None, "d6", {**WITH_CHECKPOINT, "c3": late})


def test_a_checkpoint_under_another_name_is_chain_broken() -> None:
    with pytest.raises(ChainBroken, match="another identity"):
        plan_update(None, "d6", {**WITH_CHECKPOINT, "c3": rebuilt_full(D3, "c9")})


def test_a_missing_checkpoint_is_asked_for_not_walked_around() -> None:
    """Its manifest may still be on its way (replication): the walk waits for it rather
    than reading the chain it replaces."""
    known = {m: WITH_CHECKPOINT[m] for m in ("d6", "d5", "d4")}
    assert next_manifest_needed(None, "d6", known) == "c3"
    with pytest.raises(ChainBroken) as caught:
        plan_update(None, "d6", known)
    assert caught.value.context["missing"] == "c3"


def test_the_newest_checkpoint_wins() -> None:
    c4 = rebuilt_full(D4, "c4")
    d7 = naming(delta("d7", 7, D6), "c4", "d4")
    manifests = {**WITH_CHECKPOINT, "c4": c4, "d7": d7}
    plan = plan_update(None, "d7", manifests)
    assert plan.apply == ("c4", "d5", "d6", "d7")

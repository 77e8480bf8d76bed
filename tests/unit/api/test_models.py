"""The API models accept what the examples say and refuse what the invalid ones say.

The API server enforces the same rules (tests/integration/api); these tests catch a model
that drifts from them without a cluster.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from hotload.api import (
    KvCachePolicy,
    PolicySnapshot,
    PolicySnapshotSpec,
    RolloutDeployment,
    SnapshotKind,
    SnapshotRef,
    snapshot_order,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _load(path: Path) -> dict[str, object]:
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict)
    return document


def _model_for(document: dict[str, object]) -> type[RolloutDeployment] | type[PolicySnapshot]:
    return RolloutDeployment if document["kind"] == "RolloutDeployment" else PolicySnapshot


@pytest.mark.parametrize(
    "path",
    [p for p in sorted(EXAMPLES.glob("*.yaml")) if p.name != "pod.yaml"],
    ids=lambda p: p.name,
)
def test_every_valid_example_parses_and_round_trips(path: Path) -> None:
    document = _load(path)
    model = _model_for(document).model_validate(document)
    again = _model_for(document).model_validate(model.to_k8s())
    assert again == model


@pytest.mark.parametrize(
    "path",
    [p for p in sorted((EXAMPLES / "invalid").glob("*.yaml"))],
    ids=lambda p: p.name,
)
def test_every_invalid_example_is_refused_by_the_model(path: Path) -> None:
    document = _load(path)
    model = _model_for(document)
    with pytest.raises(ValidationError):
        model.model_validate(document)


def test_incremental_without_previous_names_the_problem() -> None:
    with pytest.raises(ValidationError, match="previousIdentity"):
        PolicySnapshotSpec.model_validate(
            {"deploymentRef": {"name": "d"}, "identity": "s-1", "step": 1, "kind": "Incremental"}
        )


def test_unknown_spec_field_is_refused_not_dropped() -> None:
    with pytest.raises(ValidationError, match="previousIdentiy"):
        PolicySnapshotSpec.model_validate(
            {
                "deploymentRef": {"name": "d"},
                "identity": "s-1",
                "step": 1,
                "kind": "Full",
                "previousIdentiy": "typo",
            }
        )


def test_ref_resolves_the_cache_policy_from_the_deployment_default() -> None:
    spec = PolicySnapshotSpec.model_validate(
        {"deploymentRef": {"name": "d"}, "identity": "s-1", "step": 1, "kind": "Full"}
    )
    assert spec.ref(KvCachePolicy.NEW_SESSION).kv_cache_policy is KvCachePolicy.NEW_SESSION
    own = spec.model_copy(update={"kv_cache_policy": KvCachePolicy.NONE})
    assert own.ref(KvCachePolicy.ALL).kv_cache_policy is KvCachePolicy.NONE


def test_a_full_outranks_a_delta_of_the_same_step() -> None:
    delta = SnapshotRef(
        identity="s-5", step=5, kind=SnapshotKind.INCREMENTAL, kv_cache_policy=KvCachePolicy.ALL
    )
    full = SnapshotRef(
        identity="f-5", step=5, kind=SnapshotKind.FULL, kv_cache_policy=KvCachePolicy.ALL
    )
    older_full = SnapshotRef(
        identity="f-4", step=4, kind=SnapshotKind.FULL, kv_cache_policy=KvCachePolicy.ALL
    )
    assert full.outranks(delta)
    assert not delta.outranks(full)
    assert delta.outranks(older_full)
    assert snapshot_order(5, SnapshotKind.LORA) == snapshot_order(5, SnapshotKind.FULL)


def test_status_ignores_fields_a_newer_server_may_add() -> None:
    document = _load(EXAMPLES / "policysnapshot-full.yaml")
    document["status"] = {"phase": "Ready", "someFutureField": 1, "replicas": {}}
    assert PolicySnapshot.model_validate(document).status is not None

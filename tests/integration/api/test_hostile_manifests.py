"""Hostile PolicySnapshot and RolloutDeployment manifests against a real kube-apiserver and
the pydantic models the operator and sidecar read them with.

Hypothesis starts from the examples and mutates them: a field set to a value of the wrong
type, out of range, huge, empty, unicode or path-like; a field removed; a field added;
names and identities changed apart. Each manifest goes to the API server as a server-side
dry run (schema, CEL, defaults; nothing stored) and to the models. The property — "refused
cleanly or accepted consistently":

- the server never answers 5xx: a refusal is a 4xx with a message;
- whatever the server admits, the models read (the operator and every sidecar must be able
  to parse any object a user can create, or they would fail on it forever);
- where both accept, the object the server returns (with its defaults) and the one sent are
  the same object to the models (the CRD's defaults and the models' agree).

It would catch a CRD schema looser than the models (a step the server takes as a string, an
identity with a slash, a negative replica count), a CEL rule that throws instead of
refusing, and defaults that differ between the CRD and hotload.api.
"""

from __future__ import annotations

import copy
import string
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel, ValidationError

from hotload.api import GROUP, VERSION, PolicySnapshot, RolloutDeployment
from hotload.api.policy_snapshot import PLURAL as SNAPSHOTS
from hotload.api.rollout_deployment import PLURAL as DEPLOYMENTS

pytestmark = pytest.mark.cluster

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
SNAPSHOT_EXAMPLES = ("policysnapshot-full", "policysnapshot-incremental", "policysnapshot-lora")

_text = st.text(alphabet=string.printable + "é✓\u202e", max_size=40)
hostile_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    _text,
    st.sampled_from(
        [
            "", "a/b", "../x", ".", "..", "A-Upper", "-lead", "trail-", "x" * 300, "ok-name",
            "Full", "Incremental", "LoRA", "full", "ASYNC", "SYNC", "all", "none",
            "new_session", "hotload-delta/v1", "sha256", "adler32", "s3://b/p", "file:///x",
        ]
    ),
    st.lists(st.integers(-5, 5) | _text, max_size=3),
    st.dictionaries(_text, st.integers(-5, 5) | _text, max_size=3),
)  # fmt: skip


def _paths(document: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key path under spec and metadata.name (what a user writes)."""
    found = []
    if isinstance(document, dict):
        for key, value in document.items():
            path = (*prefix, key)
            found.append(path)
            found.extend(_paths(value, path))
    return found


def _mutate(document: dict[str, Any], path: tuple[str, ...], value: Any, drop: bool) -> None:
    node: Any = document
    for key in path[:-1]:
        node = node[key]
    if drop:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value


@st.composite
def manifests(draw: st.DrawFn, bases: list[dict[str, Any]]) -> dict[str, Any]:
    document = copy.deepcopy(draw(st.sampled_from(bases)))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(document) if p[0] in ("spec", "metadata")]
        paths = [p for p in paths if p[:2] != ("metadata", "namespace")]
        if not paths:
            break  # spec and metadata are gone already
        path = draw(st.sampled_from(paths))
        if draw(st.booleans()) and isinstance(_get(document, path), dict):
            path = (*path, draw(st.sampled_from(["extra", "identity", "step", "kind"])))
        _mutate(document, path, draw(hostile_values), drop=draw(st.integers(0, 5)) == 0)
    spec, metadata = document.get("spec"), document.get("metadata")
    paired = isinstance(spec, dict) and isinstance(metadata, dict) and "identity" in spec
    if paired and draw(st.booleans()):
        metadata["name"] = spec["identity"]  # keep the pair together
    return document


def _get(document: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = document
    for key in path:
        node = node[key]
    return node


def _load(name: str) -> dict[str, Any]:
    return cast(dict[str, Any], yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text()))


def _models_read(model: type[BaseModel], body: dict[str, Any]) -> BaseModel | None:
    try:
        return model.model_validate(body)
    except (ValidationError, ValueError, TypeError):
        return None


def _dry_run(api: k8s.ApiClient, namespace: str, plural: str, body: Any) -> dict[str, Any]:
    """The object the server would store, or the ApiException it refuses with."""
    created = k8s.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, plural, body, dry_run="All"
    )
    return cast(dict[str, Any], created)


def _check(
    api: k8s.ApiClient, namespace: str, plural: str, model: type[BaseModel], body: Any
) -> None:
    try:
        stored = _dry_run(api, namespace, plural, body)
    except ApiException as refused:
        assert 400 <= refused.status < 500, (refused.status, refused.body, body)
        assert refused.body, body
        return
    admitted = _models_read(model, stored)
    assert admitted is not None, f"the server admitted what the models cannot read: {stored}"
    sent = _models_read(model, body)
    if sent is not None:
        assert _comparable(sent) == _comparable(admitted), (body, stored)


def _comparable(model: BaseModel) -> Any:
    """What the user wrote and the models read: the name and the spec (the server prunes
    unknown ``metadata`` fields as it does for every object; the models keep it as given)."""
    data = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    return _json_numbers(
        {"name": (data.get("metadata") or {}).get("name"), "spec": data.get("spec")}
    )


def _json_numbers(value: Any) -> Any:
    """A number past 2**53 compared as the double it is in JSON: in a free-form field
    (``x-kubernetes-preserve-unknown-fields``, e.g. ``engine.resources``) the server keeps
    a number as a float64 and writes it back in its own spelling (7.204277154562494e+16
    comes back as 72042771545624940), which is the same JSON number, not a change."""
    if isinstance(value, dict):
        return {key: _json_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_numbers(item) for item in value]
    if isinstance(value, int | float) and not isinstance(value, bool) and abs(value) >= 2**53:
        return float(value)
    return value


@pytest.fixture(scope="module")
def first_api(kube_clients: dict[str, k8s.ApiClient]) -> k8s.ApiClient:
    return next(iter(kube_clients.values()))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_hostile_policy_snapshots_are_refused_cleanly_or_accepted_consistently(
    first_api: k8s.ApiClient, namespace: str, data: st.DataObject
) -> None:
    body = data.draw(manifests([_load(name) for name in SNAPSHOT_EXAMPLES]))
    _check(first_api, namespace, SNAPSHOTS, PolicySnapshot, body)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_hostile_rollout_deployments_are_refused_cleanly_or_accepted_consistently(
    first_api: k8s.ApiClient, namespace: str, data: st.DataObject
) -> None:
    body = data.draw(manifests([_load("rolloutdeployment")]))
    _check(first_api, namespace, DEPLOYMENTS, RolloutDeployment, body)

"""Render both CustomResourceDefinitions from the pydantic models.

The models are the one source of truth; ``crds/*.yaml`` is this module's output, checked
in and compared by a test. Pydantic's JSON schema is turned into a *structural* OpenAPI v3
schema (no ``$ref``, no ``anyOf`` for optionals, no ``additionalProperties`` beside
``properties``), and the server-side rules the API server enforces (CEL) are added here,
next to the printer columns, so a bad object is refused by the API server itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from hotload.api.group import CATEGORY, GROUP, VERSION
from hotload.api.labels import PART_OF, PART_OF_LABEL
from hotload.api.policy_snapshot import KIND as SNAPSHOT_KIND
from hotload.api.policy_snapshot import PLURAL as SNAPSHOT_PLURAL
from hotload.api.policy_snapshot import SHORT_NAMES as SNAPSHOT_SHORT_NAMES
from hotload.api.policy_snapshot import SINGULAR as SNAPSHOT_SINGULAR
from hotload.api.policy_snapshot import PolicySnapshotSpec, PolicySnapshotStatus
from hotload.api.rollout_deployment import KIND as DEPLOYMENT_KIND
from hotload.api.rollout_deployment import PLURAL as DEPLOYMENT_PLURAL
from hotload.api.rollout_deployment import SHORT_NAMES as DEPLOYMENT_SHORT_NAMES
from hotload.api.rollout_deployment import SINGULAR as DEPLOYMENT_SINGULAR
from hotload.api.rollout_deployment import RolloutDeploymentSpec, RolloutDeploymentStatus

Schema = dict[str, Any]

#: Keys of pydantic's JSON schema that a structural schema does not carry.
_DROPPED_KEYS = frozenset({"title", "$defs", "discriminator"})


@dataclass(frozen=True)
class Rule:
    """One CEL rule (``x-kubernetes-validations`` entry)."""

    rule: str
    message: str
    field_path: str | None = None
    reason: str | None = None

    def render(self) -> Schema:
        out: Schema = {"rule": self.rule, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class CrdDefinition:
    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    spec_model: type[BaseModel]
    status_model: type[BaseModel]
    description: str
    printer_columns: tuple[Schema, ...]
    root_rules: tuple[Rule, ...] = ()
    spec_rules: tuple[Rule, ...] = ()
    scale: Schema | None = None
    extra_spec_properties: Mapping[str, Schema] = field(default_factory=dict)


def _age_column() -> Schema:
    return {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


ROLLOUT_DEPLOYMENT = CrdDefinition(
    kind=DEPLOYMENT_KIND,
    plural=DEPLOYMENT_PLURAL,
    singular=DEPLOYMENT_SINGULAR,
    short_names=DEPLOYMENT_SHORT_NAMES,
    spec_model=RolloutDeploymentSpec,
    status_model=RolloutDeploymentStatus,
    description="A regional pool of inference replicas kept on the freshest policy snapshot "
    "by hot-swapping weights, without restarts.",
    printer_columns=(
        {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
        {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
        {"name": "Target", "type": "string", "jsonPath": ".status.targetSnapshot.identity"},
        {"name": "Current", "type": "string", "jsonPath": ".status.currentSnapshot.identity"},
        _age_column(),
    ),
    spec_rules=(
        Rule(
            "!has(self.hotLoad.credentialsSecretRef) || self.hotLoad.bucketUrl.startsWith('s3://')",
            "hotLoad.credentialsSecretRef is only used with s3:// buckets",
            field_path=".hotLoad.credentialsSecretRef",
        ),
        Rule(
            "!has(self.hotLoad.endpoint) || self.hotLoad.bucketUrl.startsWith('s3://')",
            "hotLoad.endpoint is only used with s3:// buckets",
            field_path=".hotLoad.endpoint",
        ),
    ),
    scale={
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    },
)

POLICY_SNAPSHOT = CrdDefinition(
    kind=SNAPSHOT_KIND,
    plural=SNAPSHOT_PLURAL,
    singular=SNAPSHOT_SINGULAR,
    short_names=SNAPSHOT_SHORT_NAMES,
    spec_model=PolicySnapshotSpec,
    status_model=PolicySnapshotStatus,
    description="One published policy snapshot (a full checkpoint, a lossless delta or a "
    "LoRA adapter) and its rollout ledger across the deployment's replicas.",
    printer_columns=(
        {"name": "Deployment", "type": "string", "jsonPath": ".spec.deploymentRef.name"},
        {"name": "Step", "type": "integer", "jsonPath": ".spec.step"},
        {"name": "Kind", "type": "string", "jsonPath": ".spec.kind"},
        {"name": "Ready", "type": "string", "jsonPath": ".status.replicasSummary"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        _age_column(),
    ),
    root_rules=(
        Rule(
            "self.spec.identity == self.metadata.name",
            "spec.identity must equal metadata.name (the identity is the object's name)",
            field_path=".spec.identity",
        ),
    ),
    spec_rules=(
        Rule(
            "self == oldSelf",
            "spec is immutable: publish a new PolicySnapshot instead of changing this one",
        ),
        Rule(
            "self.kind != 'Incremental' || has(self.incremental)",
            "an Incremental snapshot needs incremental.previousIdentity",
            field_path=".incremental",
            reason="FieldValueRequired",
        ),
        Rule(
            "self.kind == 'Incremental' || !has(self.incremental)",
            "only Incremental snapshots have an incremental section: Full and LoRA "
            "snapshots are always complete",
            field_path=".incremental",
            reason="FieldValueForbidden",
        ),
        Rule(
            "!has(self.incremental) || self.incremental.previousIdentity != self.identity",
            "incremental.previousIdentity must name another snapshot, not this one",
            field_path=".incremental.previousIdentity",
        ),
        Rule(
            "!has(self.incremental) || !has(self.incremental.checkpoint)"
            " || self.incremental.checkpoint.identity != self.identity",
            "incremental.checkpoint.identity names the checkpoint (a Full in the bucket), "
            "not this snapshot",
            field_path=".incremental.checkpoint.identity",
        ),
        Rule(
            "!has(self.incremental) || !has(self.incremental.checkpoint)"
            " || self.incremental.checkpoint.of != self.identity",
            "incremental.checkpoint.of must name an earlier snapshot of this delta's chain, "
            "not this one",
            field_path=".incremental.checkpoint.of",
        ),
        Rule(
            "!has(self.incremental) || !has(self.incremental.checkpoint)"
            " || self.incremental.checkpoint.identity != self.incremental.checkpoint.of",
            "incremental.checkpoint.identity (the Full) and incremental.checkpoint.of (the "
            "snapshot whose weights it holds) are two snapshots",
            field_path=".incremental.checkpoint.of",
        ),
    ),
)

ALL_CRDS: tuple[CrdDefinition, ...] = (ROLLOUT_DEPLOYMENT, POLICY_SNAPSHOT)


def structural_schema(model: type[BaseModel]) -> Schema:
    """The model's JSON schema (by alias) rewritten into a structural OpenAPI v3 schema."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    definitions: Mapping[str, Schema] = raw.get("$defs", {})
    return _structural(raw, definitions)


def _structural(node: Schema, definitions: Mapping[str, Schema]) -> Schema:
    node = _resolve(node, definitions)
    node = _drop_null_branch(node, definitions)
    out: Schema = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "properties":
            out["properties"] = {
                name: _structural(child, definitions) for name, child in value.items()
            }
        elif key == "items":
            out["items"] = _structural(value, definitions)
        elif key == "additionalProperties":
            if isinstance(value, dict) and value:
                out["additionalProperties"] = _structural(value, definitions)
        elif key == "default" and value is None:
            continue
        else:
            out[key] = value
    if out.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("type", "object")
        out.pop("additionalProperties", None)
    if "properties" in out:
        out.pop("additionalProperties", None)
    if (
        out.get("type") == "object"
        and "properties" not in out
        and "additionalProperties" not in out
    ):
        out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("format") == "date-time":
        out.pop("default", None)
    if "properties" in out and "conditions" in out["properties"]:
        conditions = out["properties"]["conditions"]
        conditions["x-kubernetes-list-type"] = "map"
        conditions["x-kubernetes-list-map-keys"] = ["type"]
    return out


def _resolve(node: Schema, definitions: Mapping[str, Schema]) -> Schema:
    """Inline a ``$ref``, keeping the referring node's own description and default."""
    ref = node.get("$ref")
    if ref is None:
        return node
    target = dict(definitions[ref.rsplit("/", 1)[-1]])
    for key, value in node.items():
        if key != "$ref":
            target[key] = value
    return target


def _drop_null_branch(node: Schema, definitions: Mapping[str, Schema]) -> Schema:
    """``X | None`` becomes ``X``: unset optionals are simply absent on the wire."""
    branches = node.get("anyOf")
    if branches is None:
        return node
    kept = [b for b in branches if b.get("type") != "null"]
    if len(kept) != 1:
        raise ValueError(f"cannot render a union of {len(kept)} types structurally: {node}")
    merged = dict(_resolve(kept[0], definitions))
    for key, value in node.items():
        if key != "anyOf":
            merged[key] = value
    return merged


def render_crd(definition: CrdDefinition) -> Schema:
    """One CustomResourceDefinition object."""
    spec_schema = structural_schema(definition.spec_model)
    if definition.spec_rules:
        spec_schema["x-kubernetes-validations"] = [r.render() for r in definition.spec_rules]
    status_schema = structural_schema(definition.status_model)
    root: Schema = {
        "type": "object",
        "description": definition.description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    if definition.root_rules:
        root["x-kubernetes-validations"] = [r.render() for r in definition.root_rules]
    subresources: Schema = {"status": {}}
    if definition.scale:
        subresources["scale"] = dict(definition.scale)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{definition.plural}.{GROUP}",
            "labels": {PART_OF_LABEL: PART_OF},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": definition.kind,
                "listKind": f"{definition.kind}List",
                "plural": definition.plural,
                "singular": definition.singular,
                "shortNames": list(definition.short_names),
                "categories": [CATEGORY],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": subresources,
                    "additionalPrinterColumns": list(definition.printer_columns),
                }
            ],
        },
    }


def render_all() -> dict[str, Schema]:
    """File name under ``crds/`` → CRD object."""
    return {f"{definition.plural}.{GROUP}.yaml": render_crd(definition) for definition in ALL_CRDS}

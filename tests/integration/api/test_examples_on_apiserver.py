"""The examples against a real kube-apiserver: the valid ones apply, each invalid one is
refused by the server with a message naming the offending field, and a snapshot's spec
cannot change after creation."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.cluster import Kubectl, KubectlFailed

pytestmark = pytest.mark.cluster

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
VALID = sorted(path for path in EXAMPLES.glob("*.yaml") if path.name != "pod.yaml")
INVALID = sorted((EXAMPLES / "invalid").glob("*.yaml"))


def _expectation(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name} must start with '# expect: <text>'"
    return first.removeprefix("# expect: ").strip()


def test_examples_are_there() -> None:
    names = {path.name for path in VALID}
    assert {
        "rolloutdeployment.yaml",
        "policysnapshot-full.yaml",
        "policysnapshot-incremental.yaml",
        "policysnapshot-lora.yaml",
    } <= names
    assert len(INVALID) >= 5


@pytest.mark.parametrize("example", VALID, ids=lambda path: path.stem)
def test_valid_example_applies(example: Path, kubectl: Kubectl, namespace: str) -> None:
    created = kubectl("apply", "-n", namespace, "-f", str(example))
    assert "created" in created
    kind_and_name = created.split()[0]
    assert kubectl("get", "-n", namespace, kind_and_name, "-o", "name").strip() == kind_and_name


@pytest.mark.parametrize("example", INVALID, ids=lambda path: path.stem)
def test_invalid_example_is_refused_naming_the_field(
    example: Path, kubectl: Kubectl, namespace: str
) -> None:
    expected = _expectation(example)
    with pytest.raises(KubectlFailed) as refused:
        kubectl("apply", "-n", namespace, "-f", str(example))
    message = refused.value.stderr
    assert (
        "is invalid" in message or "Invalid value" in message or "Unsupported value" in message
    ), message
    assert expected in message, f"expected {expected!r} in the apiserver's refusal: {message}"
    assert kubectl("get", "rd,psnap", "-n", namespace, "-o", "name").strip() == ""


@pytest.mark.parametrize(
    ("field", "patch"),
    [
        ("spec.step", '{"spec": {"step": 7}}'),
        ("spec.kind", '{"spec": {"kind": "LoRA"}}'),
        ("spec.deploymentRef", '{"spec": {"deploymentRef": {"name": "other"}}}'),
    ],
)
def test_changing_a_snapshot_spec_is_refused(
    field: str, patch: str, kubectl: Kubectl, namespace: str
) -> None:
    kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / "policysnapshot-full.yaml"))
    with pytest.raises(KubectlFailed) as refused:
        kubectl("patch", "-n", namespace, "psnap/demo-step-0", "--type=merge", "-p", patch)
    assert "spec is immutable" in refused.value.stderr, refused.value.stderr
    kept = kubectl(
        "get", "-n", namespace, "psnap/demo-step-0", "-o", "jsonpath={.spec.step} {.spec.kind}"
    )
    assert kept == "0 Full", field

"""crds/ is what the models render: a model change without `hotload crds --out crds` fails."""

from __future__ import annotations

from pathlib import Path

from hotload.cli.crds import render_documents

CRDS = Path(__file__).resolve().parents[3] / "crds"


def test_checked_in_crds_match_the_models() -> None:
    rendered = render_documents()
    on_disk = {p.name: p.read_text() for p in CRDS.glob("*.yaml")}
    assert on_disk.keys() == rendered.keys(), "run `hotload crds --out crds`"
    for name, text in rendered.items():
        assert on_disk[name] == text, f"crds/{name} is stale: run `hotload crds --out crds`"


def test_schema_is_structural() -> None:
    """No $ref, anyOf, or additionalProperties beside properties (the apiserver refuses them)."""

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            assert "$ref" not in node and "anyOf" not in node, path
            assert not ("properties" in node and "additionalProperties" in node), path
            for key, value in node.items():
                walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]")

    import yaml

    for path in CRDS.glob("*.yaml"):
        walk(yaml.safe_load(path.read_text()), path.name)

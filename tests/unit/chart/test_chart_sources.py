"""The chart carries the same CRDs and version as the project (no helm needed here).

It would catch a model change regenerated into crds/ but not into the chart (users would
install stale CRDs with helm), a hand edit of either copy, and a release whose chart and
operator versions drift apart.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml
from typer.testing import CliRunner

from hotload.cli import app
from hotload.cli.crds import render_documents

REGENERATE = "run `hotload crds --out crds --chart charts/hotload`"
REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "hotload"


def test_chart_crds_are_the_projects_crds() -> None:
    rendered = render_documents()
    in_chart = {p.name: p.read_text() for p in (CHART / "crds").glob("*.yaml")}
    assert in_chart.keys() == rendered.keys(), REGENERATE
    for name, text in rendered.items():
        assert in_chart[name] == text, f"charts/hotload/crds/{name} is stale: {REGENERATE}"
        assert (REPO / "crds" / name).read_text() == text


def test_chart_and_project_versions_move_together() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["version"] == chart["appVersion"] == project["version"]


def test_crds_command_regenerates_both_copies(tmp_path: Path) -> None:
    chart = tmp_path / "chart"
    chart.mkdir()
    (chart / "Chart.yaml").write_text("name: x\n")
    (chart / "crds").mkdir()
    (chart / "crds" / "other.yaml").write_text("kept\n")  # a CRD of the user's own

    out = tmp_path / "crds"

    result = CliRunner().invoke(app, ["crds", "--out", str(out), "--chart", str(chart)])

    assert result.exit_code == 0, result.output
    for name, text in render_documents().items():
        assert (out / name).read_text() == text
        assert (chart / "crds" / name).read_text() == text
    assert (chart / "crds" / "other.yaml").read_text() == "kept\n"


def test_crds_command_refuses_a_directory_that_is_no_chart(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["crds", "--chart", str(tmp_path)])

    assert result.exit_code == 2
    assert "no Chart.yaml" in result.output

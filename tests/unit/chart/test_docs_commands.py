"""The commands docs/chart.md and the README tell a user to run are the ones that work.

Issue 22: `helm install` as docs/chart.md said left both operator pods Pending on the local
regions (a toleration it never mentioned), and the README waited on `psnap/demo-step-0`,
which `hotload publish` never writes. Here the documented local install must be exactly
what `hotload.local.chart` installs (which every test session and the demo run), and every
snapshot a document waits on after `hotload publish` must be the name the publisher gives.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from hotload.api import SnapshotKind
from hotload.local.chart import LOCAL_TOLERATIONS, NAMESPACE, RELEASE, ChartRelease
from hotload.publish.cadence import identity_for

REPO = Path(__file__).resolve().parents[3]
CHART_DOC = REPO / "docs" / "chart.md"


def _console_lines(path: Path) -> list[str]:
    """The commands of every ```console block (after ``$ ``, comments dropped)."""
    lines = []
    for block in re.findall(r"```console\n(.*?)```", path.read_text(), re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                lines.append(line[2:].split("   #")[0].strip())
    return lines


def helm_installs(path: Path) -> list[list[str]]:
    return [shlex.split(c) for c in _console_lines(path) if c.startswith("helm install ")]


def set_values(argv: list[str]) -> dict[str, Any]:
    """``--set key={a,b}`` and ``--set-json key=JSON`` as helm reads these forms."""
    values: dict[str, Any] = {}
    for flag, assignment in itertools.pairwise(argv):
        if flag not in ("--set", "--set-json"):
            continue
        key, _, raw = assignment.partition("=")
        value: Any = json.loads(raw) if flag == "--set-json" else raw
        if flag == "--set" and raw.startswith("{") and raw.endswith("}"):
            value = [item for item in raw[1:-1].split(",") if item]
        *parents, leaf = key.split(".")
        node = values
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return values


def test_the_documented_local_install_is_what_the_local_regions_install() -> None:
    plain, local = helm_installs(CHART_DOC)
    namespaces = tuple(set_values(plain)["watchNamespaces"])
    expected = ChartRelease(watch_namespaces=namespaces).local_values()

    assert plain[:3] == local[:3] == ["helm", "install", RELEASE]
    for argv in (plain, local):
        assert argv[argv.index("--namespace") + 1] == NAMESPACE and "--create-namespace" in argv
    assert local[: len(plain)] == plain, "the local install is the same command, plus one value"
    assert set_values(local) == {
        "watchNamespaces": expected["watchNamespaces"],
        "operator": {"tolerations": [dict(t) for t in LOCAL_TOLERATIONS]},
    }
    assert expected["operator"] == {"tolerations": [dict(t) for t in LOCAL_TOLERATIONS]}
    assert expected["clusterWide"] == {"enabled": False}, "the docs install the default scope"
    assert f"kubectl create namespace {namespaces[0]}" in _console_lines(CHART_DOC)


@pytest.mark.parametrize("doc", ["README.md", "docs/chart.md"])
def test_a_snapshot_waited_on_after_publish_is_the_one_publish_writes(doc: str) -> None:
    commands = _console_lines(REPO / doc)
    publishes = [shlex.split(c) for c in commands if c.startswith("hotload publish ")]
    waits = [c for c in commands if c.startswith("kubectl") and " wait psnap/" in c]
    assert publishes and waits, f"{doc} shows a publish and a wait"

    argv = publishes[0]
    deployment = argv[argv.index("-d") + 1]
    step = int(argv[argv.index("--step") + 1])
    written = identity_for(deployment, step, SnapshotKind.FULL)
    waited = re.search(r"wait psnap/([a-z0-9.-]+)", waits[0])
    assert waited is not None and waited.group(1) == written

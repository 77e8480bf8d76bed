"""``helm template`` and ``helm lint`` of the checkout's chart with the pinned helm."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hotload.local import helm_path
from hotload.local.chart import chart_path

Manifest = dict[str, Any]


def helm(
    *args: str, values: Mapping[str, Any] | None = None, tmp: Path
) -> subprocess.CompletedProcess[str]:
    argv = [str(helm_path()), *args]
    if values is not None:
        path = tmp / "values.yaml"
        path.write_text(yaml.safe_dump(dict(values)))
        argv += ["--values", str(path)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def render(
    tmp: Path, values: Mapping[str, Any] | None = None, *, release: str = "hotload"
) -> list[Manifest]:
    """Every object the chart renders with ``values``, CRDs included (in ``hotload-system``)."""
    done = helm(
        "template", release, str(chart_path()), "--namespace", "hotload-system",
        "--include-crds", values=values, tmp=tmp,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def find(objects: list[Manifest], kind: str, name: str | None = None) -> list[Manifest]:
    return [
        o for o in objects
        if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]  # fmt: skip


def one(objects: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    (found,) = find(objects, kind, name)
    return found

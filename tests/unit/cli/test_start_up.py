"""How much ``hotload --help`` and ``hotload snapshot --help`` import before they answer.

Start-up time is what a user feels on every command and what a pod pays on every
restart; it is set by imports, so this pins the imports (not a timer, which the shared
machine would make flaky): the heavy libraries and our own heavy packages stay out
until a command needs them, and the module count stays near what it is today (150 and
273 modules on Python 3.11 with the pinned typer; a timer-free stand-in for the
≤ 0.15 s target, see bench/codec and docs/codec.md). ``hotload snapshot decode`` is held
to the libraries the decoder needs, not to a module count.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

#: Never imported just to print help: rich's help renderer (markdown parsing), the
#: numeric stack, Kubernetes clients, HTTP, torch, and our heavy packages.
NEVER = (
    "rich",
    "markdown_it",
    "numpy",
    "zstandard",
    "torch",
    "kubernetes",
    "kubernetes_asyncio",
    "kopf",
    "httpx",
    "boto3",
    "hotload.api",
    "hotload.snapshot",
    "hotload.sidecar",
    "hotload.engines",
    "hotload.local",
    "hotload.operator",
)

PROBE = """
import json, sys
sys.argv = ["hotload", *json.loads(sys.argv[1])]
from hotload.cli import main
try:
    main()
except SystemExit:
    pass
sys.stdout = sys.__stdout__
print("\\n@@" + json.dumps(sorted(sys.modules)))
"""


def imported(*args: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(list(args))],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    modules: list[str] = json.loads(result.stdout.rsplit("@@", 1)[1])
    return modules


@pytest.mark.parametrize(
    ("args", "budget", "allowed"),
    [
        (("--help",), 190, ()),
        (("snapshot", "--help"), 320, ("pydantic",)),  # typer builds pydantic adapters
    ],
)
def test_help_imports_nothing_heavy(
    args: tuple[str, ...], budget: int, allowed: tuple[str, ...]
) -> None:
    modules = imported(*args)
    heavy = sorted(
        name
        for name in modules
        if any(name == n or name.startswith(n + ".") for n in NEVER)
        and not any(name == a or name.startswith(a + ".") for a in allowed)
    )
    assert heavy == [], f"hotload {' '.join(args)} imports {heavy[:10]}"
    assert len(modules) <= budget, f"hotload {' '.join(args)} imports {len(modules)} modules"


#: Never imported by ``hotload snapshot decode``: every CRD model of hotload.api (building
#: pydantic schemas was most of its import time), the encoder, the inspector, the torch
#: bridge, and everything of the control plane. What stays is the decoder's own modules,
#: numpy, zstandard, xxhash — and pydantic, which typer's parameter adapters import.
NEVER_FOR_DECODE = (
    "torch",
    "rich",
    "kubernetes",
    "kubernetes_asyncio",
    "httpx",
    "boto3",
    "hotload.api._base",
    "hotload.api.snapshot_ref",
    "hotload.api.conditions",
    "hotload.api.policy_snapshot",
    "hotload.api.rollout_deployment",
    "hotload.snapshot.encoder",
    "hotload.snapshot.inspection",
    "hotload.snapshot.state_dict",
    "hotload.snapshot.planner",
    "hotload.sidecar",
    "hotload.engines",
    "hotload.storage",
    "hotload.local",
    "hotload.operator",
)


def test_snapshot_decode_imports_only_the_decoder(tmp_path: Path) -> None:
    from hotload.snapshot import encode, encode_full, rebuild
    from tests.unit.snapshot.models import base_tensors, next_step, write_model

    v1_tensors = base_tensors()
    v1 = write_model(tmp_path / "v1", {"model.safetensors": v1_tensors})
    v2 = write_model(tmp_path / "v2", {"model.safetensors": next_step(v1_tensors)})
    full = encode_full(v1, tmp_path / "s1", identity="s1", step=1)
    rebuild(None, full.path, tmp_path / "r1")
    encode(tmp_path / "r1", v2, tmp_path / "s2", identity="s2", step=2, previous_identity="s1")
    modules = imported(
        "snapshot",
        "decode",
        "--previous",
        str(tmp_path / "r1"),
        "--snapshot",
        str(tmp_path / "s2"),
        "--out",
        str(tmp_path / "r2"),
    )
    assert (tmp_path / "r2" / "model.safetensors").is_file()  # it did decode
    heavy = sorted(
        name
        for name in modules
        if any(name == n or name.startswith(n + ".") for n in NEVER_FOR_DECODE)
    )
    assert heavy == [], f"hotload snapshot decode imports {heavy[:10]}"
    # Which libraries it loads, not how many modules they happen to have: only what the
    # decoder needs (numpy, zstandard, xxhash, pydantic for the manifest, typer for the
    # command line) and what those declare they need.
    allowed = _dependency_closure("numpy", "zstandard", "xxhash", "pydantic", "typer")
    foreign = sorted(top for top in _third_party(modules) if not _distributions(top) & allowed)
    assert foreign == [], f"hotload snapshot decode loads libraries it does not need: {foreign}"


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _dependency_closure(*names: str) -> set[str]:
    """These distributions and every one they require, transitively (extras left out)."""
    seen: set[str] = set()
    todo = [_normalized(name) for name in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requirements = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for requirement in requirements:
            if "extra ==" not in requirement:
                todo.append(_normalized(re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0]))
    return seen


def _third_party(modules: list[str]) -> set[str]:
    """Top-level modules that are neither the standard library's, ours, nor private
    machinery of the install (``_distutils_hack``, an editable install's finder)."""
    tops = {name.split(".")[0] for name in modules}
    return {
        top
        for top in tops
        if top not in sys.stdlib_module_names and top != "hotload" and not top.startswith("_")
    }


def _distributions(top: str) -> set[str]:
    return {_normalized(name) for name in metadata.packages_distributions().get(top, [])}

"""An earlier commit's ``hotload`` package, importable beside this checkout's as another name.

The encoder bench measures today's encoder against the one before it *in the same
process* (same data, same machine state, interleaved runs). So the earlier commit's
``hotload/`` is exported with ``git archive`` into a cache directory as the package
``hotload_baseline`` (every ``hotload`` import inside it renamed), and its native kernels
are compiled there with the compiler setuptools finds (the same flags as ``setup.py``).

    from baseline_package import load_baseline
    old = load_baseline("d2baf31")        # the module hotload_baseline
    old.snapshot.encode(...)
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType

REPOSITORY = Path(__file__).resolve().parents[2]
CACHE = Path.home() / ".cache" / "hotload" / "bench-baselines"
NAME = "hotload_baseline"
_SUBPACKAGES = (
    *("api", "cancellation", "cli", "engines", "errors", "kube", "local", "logs", "mounts"),
    *("operator", "publish", "retry", "sidecar", "snapshot", "storage", "waiting"),
)
_IMPORT = re.compile(r"\b(from|import) hotload(?=[.\s])")
# module paths in strings too (the lazy public names of hotload.snapshot, say)
_PATH = re.compile(r"(?<![\w./-])hotload(?=\.(?:" + "|".join(_SUBPACKAGES) + r")\b)")
FLAGS = ["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"]


def _export(commit: str, into: Path) -> None:
    """``hotload/`` at ``commit`` as ``into/hotload_baseline``, imports renamed."""
    with tempfile.TemporaryDirectory() as scratch:
        archive = Path(scratch) / "tree.tar"
        subprocess.run(
            ["git", "-C", str(REPOSITORY), "archive", "-o", str(archive), commit, "hotload"],
            check=True,
        )
        with tarfile.open(archive) as tar:
            tar.extractall(scratch, filter="data")
        (Path(scratch) / "hotload").rename(into / NAME)
    for path in (into / NAME).rglob("*.py"):
        text = path.read_text()
        text = _IMPORT.sub(lambda m: f"{m.group(1)} {NAME}", text)
        path.write_text(_PATH.sub(NAME, text))


def _build(package: Path) -> None:
    """Compile every native module of the exported package in place."""
    from setuptools import Distribution, Extension

    modules = [
        Extension(
            ".".join(source.relative_to(package.parent).with_suffix("").parts),
            sources=[str(source)],
            extra_compile_args=FLAGS,
        )
        for source in sorted(package.rglob("*.c"))
    ]
    distribution = Distribution({"name": NAME, "ext_modules": modules})
    command = distribution.get_command_obj("build_ext")
    command.inplace = False
    command.build_lib = str(package.parent)
    command.build_temp = str(package.parent / "build")
    command.ensure_finalized()
    command.run()


def load_baseline(commit: str) -> ModuleType:
    """The package ``hotload_baseline`` as it was at ``commit`` (exported and built once)."""
    resolved = subprocess.run(
        ["git", "-C", str(REPOSITORY), "rev-parse", "--verify", f"{commit}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    root = CACHE / f"{resolved}-{sysconfig.get_config_var('SOABI')}"
    if not (root / "ready").exists():
        root.mkdir(parents=True, exist_ok=True)
        if not (root / NAME).exists():
            _export(resolved, root)
        _build(root / NAME)
        (root / "ready").write_text(resolved)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(NAME)

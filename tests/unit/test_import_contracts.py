"""The import-linter contract that keeps test doubles out of the product names every module.

Would catch: a new top-level module of ``hotload`` (say ``hotload.trust``) that the
contract "the product never imports its test doubles" does not list, so it could import
``hotload.testing`` without ``lint-imports`` noticing.
"""

from __future__ import annotations

import pkgutil
import tomllib
from pathlib import Path

import hotload

REPO = Path(__file__).resolve().parents[2]


def test_the_test_doubles_contract_lists_every_product_module() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [
        c for c in config["contracts"] if c["name"] == "the product never imports its test doubles"
    ]
    assert contract["forbidden_modules"] == ["hotload.testing"]
    product = {f"hotload.{m.name}" for m in pkgutil.iter_modules(hotload.__path__)}
    assert "hotload.testing" in product
    assert set(contract["source_modules"]) == product - {"hotload.testing"}

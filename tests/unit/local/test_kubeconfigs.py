"""Kubeconfigs: one context per region, named after it, credentials embedded."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import yaml

from hotload.local.certificates import RegionCertificates
from hotload.local.kubeconfigs import KubeconfigEntry, write


def _certs(directory: Path, tag: str) -> RegionCertificates:
    directory.mkdir(parents=True)
    for name in ("ca.crt", "admin.crt", "admin.key"):
        (directory / name).write_text(f"{tag}-{name}")
    return RegionCertificates(directory)


def test_one_context_per_region_with_embedded_credentials(tmp_path: Path) -> None:
    entries = [
        KubeconfigEntry("east", "https://127.0.0.1:1001", _certs(tmp_path / "east", "e")),
        KubeconfigEntry("west", "https://127.0.0.1:1002", _certs(tmp_path / "west", "w")),
    ]
    path = write(tmp_path / "kubeconfig", entries)
    config = yaml.safe_load(path.read_text())

    assert config["current-context"] == "east"
    assert [c["name"] for c in config["contexts"]] == ["east", "west"]
    west = next(c for c in config["clusters"] if c["name"] == "west")["cluster"]
    assert west["server"] == "https://127.0.0.1:1002"
    assert base64.b64decode(west["certificate-authority-data"]) == b"w-ca.crt"
    user = next(u for u in config["users"] if u["name"] == "west-admin")["user"]
    assert base64.b64decode(user["client-key-data"]) == b"w-admin.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

"""A region's certificates, made with the real openssl: what the apiserver and clients need."""

from __future__ import annotations

import subprocess
from pathlib import Path

from hotload.local.certificates import make_certificates


def _text(cert: Path) -> str:
    return subprocess.run(
        ["openssl", "x509", "-in", str(cert), "-noout", "-text"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_serving_and_admin_certificates_chain_to_the_region_ca(tmp_path: Path) -> None:
    certs = make_certificates(tmp_path / "certs", "east")
    assert certs.complete()
    verified = subprocess.run(
        [
            "openssl",
            "verify",
            "-CAfile",
            str(certs.ca_cert),
            str(certs.serving_cert),
            str(certs.admin_cert),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert verified.returncode == 0, verified.stderr

    serving = _text(certs.serving_cert)
    for name in ("IP Address:127.0.0.1", "DNS:localhost", "DNS:kubernetes.default.svc"):
        assert name in serving
    assert "TLS Web Server Authentication" in serving
    admin = _text(certs.admin_cert)
    assert "O = system:masters" in admin and "TLS Web Client Authentication" in admin
    assert "BEGIN PUBLIC KEY" in certs.service_account_public_key.read_text()
    assert (certs.ca_key.stat().st_mode & 0o077) == 0


def test_complete_certificates_are_kept(tmp_path: Path) -> None:
    first = make_certificates(tmp_path / "certs", "east")
    before = first.ca_cert.read_bytes()
    again = make_certificates(tmp_path / "certs", "east")
    assert again.ca_cert.read_bytes() == before


def test_every_region_has_its_own_ca(tmp_path: Path) -> None:
    east = make_certificates(tmp_path / "east", "east")
    west = make_certificates(tmp_path / "west", "west")
    crossed = subprocess.run(
        ["openssl", "verify", "-CAfile", str(east.ca_cert), str(west.admin_cert)],
        capture_output=True,
        check=False,
    )
    assert crossed.returncode != 0

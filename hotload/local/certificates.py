"""Certificates of one region, made with ``openssl``: a CA, a serving certificate, an
admin client certificate and the service-account signing key pair.

Every region gets its own CA, so a client configured for one region cannot talk to
another by mistake. Keys are ECDSA P-256 (fast to make, which matters when tests start
regions); the service-account key is RSA, the kind every Kubernetes version accepts.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from hotload.errors import LocalRegionError, ToolMissing

#: Names the serving certificate answers to: loopback, and what in-cluster clients dial.
SERVING_DNS_NAMES: Final = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
SERVING_IPS: Final = ("127.0.0.1",)
ADMIN_GROUP: Final = "system:masters"
ADMIN_USER: Final = "hotload-admin"
VALID_DAYS: Final = 3650


@dataclass(frozen=True)
class RegionCertificates:
    """Paths of one region's certificates and keys (all PEM)."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.directory / "serving.crt"

    @property
    def serving_key(self) -> Path:
        return self.directory / "serving.key"

    @property
    def admin_cert(self) -> Path:
        return self.directory / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.directory / "admin.key"

    @property
    def service_account_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def service_account_public_key(self) -> Path:
        return self.directory / "sa.pub"

    def complete(self) -> bool:
        files = (
            self.ca_cert,
            self.ca_key,
            self.serving_cert,
            self.serving_key,
            self.admin_cert,
            self.admin_key,
            self.service_account_key,
            self.service_account_public_key,
        )
        return all(path.is_file() for path in files)


def _openssl(*args: str, cwd: Path) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise ToolMissing(
            "openssl is needed to make the local regions' certificates", tool="openssl"
        )
    result = subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise LocalRegionError(
            "openssl failed", command=" ".join(args[:2]), stderr=result.stderr.strip()[-500:]
        )


def _config(path: Path, extensions: str) -> Path:
    """A minimal openssl config: distinguished name from -subj, our extensions only."""
    path.write_text(
        "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\n[ext]\n" + extensions + "\n"
    )
    return path


def _signed(certs: RegionCertificates, stem: str, subject: str, extensions: str) -> None:
    work = certs.directory
    config = _config(work / f"{stem}.cnf", extensions)
    _openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{stem}.key", "-out", f"{stem}.csr", "-subj", subject, "-config", str(config),
        cwd=work,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{stem}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", f"{stem}.crt", "-days", str(VALID_DAYS),
        "-extfile", str(config), "-extensions", "ext",
        cwd=work,
    )  # fmt: skip
    (work / f"{stem}.csr").unlink()
    config.unlink()


def make_certificates(directory: Path, region: str) -> RegionCertificates:
    """Create (or keep, when complete) the certificates of ``region`` under ``directory``."""
    certs = RegionCertificates(directory)
    if certs.complete():
        return certs
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    ca_config = _config(
        directory / "ca.cnf",
        "basicConstraints = critical, CA:TRUE\nkeyUsage = critical, keyCertSign, cRLSign, "
        "digitalSignature\nsubjectKeyIdentifier = hash",
    )
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "ca.key", "-out", "ca.crt", "-days", str(VALID_DAYS),
        "-subj", f"/CN=hotload-local-ca-{region}", "-config", str(ca_config),
        "-extensions", "ext",
        cwd=directory,
    )  # fmt: skip
    ca_config.unlink()
    alt_names = ", ".join(
        [f"DNS:{name}" for name in SERVING_DNS_NAMES] + [f"IP:{ip}" for ip in SERVING_IPS]
    )
    _signed(
        certs,
        "serving",
        "/CN=kube-apiserver",
        "basicConstraints = critical, CA:FALSE\nkeyUsage = critical, digitalSignature, "
        f"keyEncipherment\nextendedKeyUsage = serverAuth\nsubjectAltName = {alt_names}",
    )
    _signed(
        certs,
        "admin",
        f"/O={ADMIN_GROUP}/CN={ADMIN_USER}",
        "basicConstraints = critical, CA:FALSE\nkeyUsage = critical, digitalSignature, "
        "keyEncipherment\nextendedKeyUsage = clientAuth",
    )
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=directory)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
    for key in directory.glob("*.key"):
        key.chmod(0o600)
    return certs

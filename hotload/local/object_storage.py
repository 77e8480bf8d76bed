"""A region's bucket: one MinIO per region (the object storage add-on), and how to reach it.

Inside the region (its sidecars) the bucket is at the MinIO's own port; from outside (the
trainer's side, another region's replication) it is reached through the region's emulated
WAN link (:mod:`hotload.local.wan`). Each region has its own root credentials, written
(mode 0600) into the region's directory, and, for the publisher, into a shared AWS
credentials file with one profile per region named after its kube context
(``<state>/aws/credentials``): what ``hotload publish`` picks up by context.

MinIO is AGPL: a test-time tool we build and run, never something we ship.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from hotload.errors import LocalRegionError
from hotload.local.processes import ProcessSpec, Wave
from hotload.local.readiness import HttpReady
from hotload.local.region import Region
from hotload.storage import StorageCredentials

BUCKET: Final = "hotload"
PREFIX: Final = "snapshots"
CREDENTIALS_FILE: Final = "object-storage.json"
S3_REGION: Final = "us-east-1"
#: Noncurrent object versions (kept by versioning, which replication needs) go after this.
NONCURRENT_DAYS: Final = 1


def enabled(region: Region) -> bool:
    return region.addons.object_storage


def _port(value: int | None, what: str, region: Region) -> int:
    if value is None:
        raise LocalRegionError(
            f"the region has no {what} port: no object storage", region=region.name
        )
    return value


def endpoint(region: Region) -> str:
    """The S3 endpoint inside the region (what its RolloutDeployments name)."""
    return f"http://127.0.0.1:{_port(region.ports.minio, 'MinIO', region)}"


def bucket_url(region: Region) -> str:
    """The region's bucket prefix for snapshots."""
    return f"s3://{BUCKET}/{PREFIX}"


def data_dir(region: Region) -> Path:
    return region.directory / "minio"


def credentials_path(region: Region) -> Path:
    return region.directory / CREDENTIALS_FILE


def make_credentials(region: Region) -> StorageCredentials:
    """Fresh root credentials for the region's MinIO, saved beside its state (0600)."""
    creds = StorageCredentials(
        access_key_id=f"hotload-{region.name}"[:20], secret_access_key=secrets.token_urlsafe(24)
    )
    path = credentials_path(region)
    path.parent.mkdir(parents=True, exist_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        json.dump(
            {"accessKeyId": creds.access_key_id, "secretAccessKey": creds.secret_access_key}, handle
        )
    return creds


def credentials(region: Region) -> StorageCredentials:
    """The region's MinIO root credentials (made by ``up``)."""
    try:
        data = json.loads(credentials_path(region).read_text())
    except (OSError, ValueError) as err:
        raise LocalRegionError(
            "the region's object storage credentials are missing", region=region.name
        ) from err
    return StorageCredentials(data["accessKeyId"], data["secretAccessKey"])


def write_aws_profiles(regions: list[Region], directory: Path) -> tuple[Path, Path]:
    """``credentials`` and ``config`` with one profile per region, named after its context.

    Point ``AWS_SHARED_CREDENTIALS_FILE`` and ``AWS_CONFIG_FILE`` at them and the
    publisher finds each region's credentials by context (CONTRACTS.md).
    """
    directory.mkdir(parents=True, exist_ok=True)
    creds_lines, config_lines = [], []
    for region in regions:
        if not enabled(region):
            continue
        creds = credentials(region)
        creds_lines += [
            f"[{region.context}]",
            f"aws_access_key_id = {creds.access_key_id}",
            f"aws_secret_access_key = {creds.secret_access_key}",
            "",
        ]
        config_lines += [f"[profile {region.context}]", f"region = {S3_REGION}", ""]
    creds_file, config_file = directory / "credentials", directory / "config"
    for path, lines in ((creds_file, creds_lines), (config_file, config_lines)):
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
            handle.write("\n".join(lines))
    return creds_file, config_file


def minio_process(region: Region, tools: Mapping[str, Path]) -> ProcessSpec | None:
    if not enabled(region):
        return None
    port = _port(region.ports.minio, "MinIO", region)
    console = _port(region.ports.minio_console, "MinIO console", region)
    creds = credentials(region)
    check = HttpReady(f"http://127.0.0.1:{port}/minio/health/live")
    return ProcessSpec(
        name="minio",
        argv=(
            str(tools["minio"]),
            "server",
            str(data_dir(region)),
            "--address",
            f"127.0.0.1:{port}",
            "--console-address",
            f"127.0.0.1:{console}",
            "--quiet",
        ),
        wave=Wave.STORAGE,
        ready=check,
        ready_what=check.describe(),
        env={
            "MINIO_ROOT_USER": creds.access_key_id,
            "MINIO_ROOT_PASSWORD": creds.secret_access_key,
            "MINIO_BROWSER": "off",
            "MINIO_UPDATE": "off",
            "HOME": str(data_dir(region)),
        },
        ports=(port, console),
        ready_timeout_s=60.0,
    )


def s3_client(region: Region, url: str | None = None) -> Any:
    """A boto3 client for the region's MinIO as its root user (setup only)."""
    import boto3
    from botocore.config import Config

    creds = credentials(region)
    return boto3.client(
        "s3",
        endpoint_url=url or endpoint(region),
        aws_access_key_id=creds.access_key_id,
        aws_secret_access_key=creds.secret_access_key,
        region_name=S3_REGION,
        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 5}),
    )


def prepare_bucket(region: Region) -> None:
    """Create the region's bucket (versioned when it replicates: MinIO needs it)."""
    client = s3_client(region)
    existing = {bucket["Name"] for bucket in client.list_buckets().get("Buckets", [])}
    if BUCKET not in existing:
        client.create_bucket(Bucket=BUCKET)
    if region.addons.replication:
        client.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
        client.put_bucket_lifecycle_configuration(
            Bucket=BUCKET,
            LifecycleConfiguration={
                "Rules": [
                    {
                        "ID": "noncurrent-versions",
                        "Status": "Enabled",
                        "Filter": {"Prefix": ""},
                        "NoncurrentVersionExpiration": {"NoncurrentDays": NONCURRENT_DAYS},
                    }
                ]
            },
        )

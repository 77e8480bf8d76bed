"""MinIO bucket replication between the regions' buckets, set up with MinIO's own client.

Every region's bucket replicates to every other region's, each copy pushed through the
receiving region's WAN link, so a snapshot written to any one region (the publisher's
``--home``) crosses each link once. MinIO never replicates a replica again, so a mesh
costs nothing over a star. Replication's proxying is off: MinIO would answer a read of an
object that has not arrived yet by fetching it from the source region, once per replica,
across the WAN. Objects may arrive in any order (the manifest before the files it lists):
the sidecar treats a listed file that is not there yet as NotFound, transient.
Deletes replicate too (``hotload gc`` then only has to clean the home bucket, though it
cleans all of them).
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, Final

from hotload.errors import LocalRegionError
from hotload.local import object_storage, wan
from hotload.local.region import Region
from hotload.local.tools import tool_path
from hotload.waiting import wait_until

log = logging.getLogger(__name__)

REPLICATE: Final = "delete,delete-marker,existing-objects"
TIMEOUT_S: Final = 60.0


def _alias(region: Region) -> str:
    return region.name.replace("-", "_")


def _url(region: Region, endpoint: str) -> str:
    creds = object_storage.credentials(region)
    host = endpoint.removeprefix("http://")
    return f"http://{creds.access_key_id}:{creds.secret_access_key}@{host}"


NO_CONFIG: Final = "replication configuration not set"


def _mc(config_dir: Path, regions: Sequence[Region], *args: str, allow: str | None = None) -> str:
    """Run mc; its stdout. An error whose text contains ``allow`` counts as empty output."""
    env = {
        **os.environ,
        **{f"MC_HOST_{_alias(r)}": _url(r, object_storage.endpoint(r)) for r in regions},
    }
    command = [str(tool_path("mc")), "--config-dir", str(config_dir), "--quiet", *args]
    try:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as err:
        raise LocalRegionError("mc did not finish", args=" ".join(args[:3])) from err
    if done.returncode != 0 and allow is not None and allow in done.stdout + done.stderr:
        return ""
    if done.returncode != 0:
        # Never echo the command line: the remote URL holds credentials.
        raise LocalRegionError(
            "mc failed to set up replication",
            operation=" ".join(args[:2]),
            error=done.stderr.strip()[-500:] or done.stdout.strip()[-500:],
        )
    return done.stdout


def replicate_mesh(regions: Sequence[Region], config_dir: Path) -> int:
    """Make every region's bucket replicate to every other's; the number of rules made."""
    members = [r for r in regions if object_storage.enabled(r) and r.addons.replication]
    if len(members) < 2:
        return 0
    config_dir.mkdir(parents=True, exist_ok=True)
    rules = 0
    for source in members:
        bucket = f"{_alias(source)}/{object_storage.BUCKET}"
        existing = _mc(config_dir, members, "replicate", "ls", bucket, allow=NO_CONFIG)
        for priority, target in enumerate((r for r in members if r is not source), start=1):
            remote = f"{_url(target, wan.endpoint(target))}/{object_storage.BUCKET}"
            if wan.endpoint(target).removeprefix("http://") in existing:
                continue
            _mc(
                config_dir,
                members,
                "replicate", "add", f"{_alias(source)}/{object_storage.BUCKET}",
                "--remote-bucket", remote,
                "--replicate", REPLICATE,
                "--priority", str(priority),
                # MinIO would otherwise answer a GET for an object not replicated yet by
                # fetching it from the source region: once per replica, across the WAN.
                "--disable-proxy",
            )  # fmt: skip
            rules += 1
    log.info(
        "bucket replication set up", extra={"regions": [r.name for r in members], "rules": rules}
    )
    return rules


#: The probe object :func:`wait_flowing` rewrites (outside every snapshot's prefix).
PROBE_KEY: Final = ".hotload-probe"
PROBE_ATTEMPT_S: Final = 3.0
"""How long one probe may take to reach every replica before the next is written: MinIO
checks a replication target's health every 5 s, so a second probe written after the next
check replicates at once."""


def wait_flowing(home: Region, replicas: Sequence[Region], *, timeout_s: float = TIMEOUT_S) -> bool:
    """Wait until replication from ``home`` reaches every region in ``replicas`` again
    (False: not within ``timeout_s``).

    Settling a WAN link (:func:`hotload.local.wan.settle`) closes it for a moment. When
    MinIO's 5-second health check of a replication target falls into that moment, MinIO
    marks the target offline until its next check, and whatever it replicates meanwhile
    waits in its retry queue for one to several minutes (seen in the demo: one step Ready
    in a region after 57 s, in another run 274 s, instead of 2 s). A small probe object,
    written into the home bucket until one arrives everywhere, shows the link carries
    replication again before the next snapshot is written. This narrows the window but
    does not close it: a health check cut by the settle can still report its failure
    after the probe arrived. A timeout is logged, not raised: the publisher then waits
    for that snapshot's files itself (and applies it after ``replication_timeout_s``).
    """
    others = [r for r in replicas if r is not home and object_storage.enabled(r)]
    if not others or not object_storage.enabled(home):
        return True
    source = object_storage.s3_client(home)
    clients = {r.name: object_storage.s3_client(r) for r in others}
    started = time.monotonic()
    deadline = started + timeout_s
    attempt = 0
    while time.monotonic() < deadline:
        attempt += 1
        body = f"{os.getpid()}-{time.time_ns()}-{attempt}".encode()
        source.put_object(Bucket=object_storage.BUCKET, Key=PROBE_KEY, Body=body)
        arrived = partial(_arrived, clients, body, set(clients))
        attempt_s = min(deadline - time.monotonic(), PROBE_ATTEMPT_S)
        if wait_until(arrived, max(attempt_s, 0.0), interval_s=0.05):
            log.debug(
                "bucket replication flows",
                extra={"home": home.name, "probes": attempt, "seconds": time.monotonic() - started},
            )
            return True
    log.warning(
        "bucket replication did not carry a probe in time",
        extra={"home": home.name, "timeout_s": timeout_s, "probes": attempt},
    )
    return False


def _arrived(clients: dict[str, Any], body: bytes, waiting: set[str]) -> bool:
    """Drop from ``waiting`` every replica that holds ``body``; True once none is left."""
    waiting.difference_update([name for name in sorted(waiting) if _holds(clients[name], body)])
    return not waiting


def _holds(client: Any, body: bytes) -> bool:
    """The replica's probe object is the one just written."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        found = client.get_object(Bucket=object_storage.BUCKET, Key=PROBE_KEY)["Body"].read()
    except (ClientError, BotoCoreError):  # not there yet (NoSuchKey), or busy: not yet
        return False
    return bool(found == body)

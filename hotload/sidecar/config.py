"""The agent's one frozen configuration object.

Only the ``hotload sidecar`` shell builds it from ``os.environ`` (the pod contract's
downward-API env); the pod runtime's shared mode builds one per pod from the pod spec.
Everything the agent needs about its deployment (bucket, endpoint, engine, transition,
policies) it reads from the RolloutDeployment object, not from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hotload.api.pod import (
    ENV_DEPLOYMENT,
    ENV_ENGINE_HOST,
    ENV_NODE_NAME,
    ENV_POD_IP,
    ENV_POD_NAME,
    ENV_POD_NAMESPACE,
    ENV_ROOT,
    SIDECAR_PORT,
    STAGING_MOUNT_PATH,
)
from hotload.errors import ConfigError
from hotload.mounts import host_path, root_from
from hotload.retry import RetryPolicy
from hotload.storage import StorageCredentials


@dataclass(frozen=True)
class AgentConfig:
    """Who the agent is (its pod) and how it behaves; one per pod."""

    pod_name: str
    namespace: str
    deployment: str
    """The RolloutDeployment's name (``HOTLOAD_DEPLOYMENT``)."""
    pod_ip: str | None = None
    """Address to bind; None binds all interfaces (no 127.0.0.1)."""
    engine_address: str | None = None
    """Where the engine listens (``HOTLOAD_ENGINE_HOST``: loopback in a rendered pod);
    None: the pod's IP."""
    node_name: str | None = None
    credentials: StorageCredentials | None = None
    """Bucket credentials from the deployment's Secret (boto3's names, read by the shell);
    None: anonymous, or the environment's own chain (instance roles)."""
    root: Path | None = None
    """``HOTLOAD_ROOT`` under the local pod runtime; None in a real pod."""
    serve_http: bool = True
    """Serve the front and the probes on ``http_port``; False in the runtime's shared mode."""
    http_port: int = SIDECAR_PORT
    download_concurrency: int = 8
    """Parallel ranged reads per file."""
    download_part_size: int = 8 * 1024 * 1024
    """Bytes per ranged read: the unit a killed download resumes from."""
    decode_threads: int = 2
    """Threads decoding a delta's chunks (beside serving: keep it below the core count)."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """The agent's retries of a whole load (storage errors the storage layer already
    retried, ``NotFound``, engine busy) and of its watch and pod writes: the policy's
    defaults, 0.5 s doubling to 30 s, half of each delay random, never giving up."""
    api_retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(maximum_s=4.0))
    """Reconnecting the deployment watch and retrying the pod's report: capped low, so
    the first target after an API server outage is seen, and the pod repaired, within
    seconds of its return (half of each delay random: a fleet does not come back in
    lockstep)."""
    engine_check_interval_s: float = 5.0
    """How often the engine is asked what it serves, at the least (the pod's report
    follows within this of a restart)."""
    engine_report_timeout_s: float = 10.0
    """An engine that does not answer a report within this is unreachable for now."""
    engine_ready_timeout_s: float = 10.0
    """How long a swap waits for the engine's health check before retrying later."""
    pod_check_interval_s: float = 10.0
    """After the Pod was found gone: how long until it is looked for again (other
    writers' changes are seen through a watch of the Pod, not by reading it back)."""
    sync_drain_timeout_s: float = 60.0
    """SYNC: the longest a swap waits for in-flight requests before swapping anyway."""
    unexpected_failure_cap: int = 5
    """Unexpected failures of one target retried as transient before Failed/InternalError."""
    history_limit: int = 20
    """Swaps remembered for ``/status``."""
    hold_timeout_s: float = 120.0
    """ASYNC: how long a new request may wait for a swap to end before it is refused."""
    retry_after_s: int = 1
    """SYNC: the ``Retry-After`` of a 425 answered during a swap."""
    max_request_bytes: int = 16 * 1024 * 1024
    """The front refuses (413) a request body larger than this."""
    max_json_depth: int = 64
    """The front refuses (400) a request body nesting JSON deeper than this."""

    @property
    def staging_dir(self) -> Path:
        """The staging volume (``emptyDir`` of medium Memory) on this host."""
        return host_path(STAGING_MOUNT_PATH, self.root)

    @property
    def bind_host(self) -> str:
        """Where our servers listen: the pod's IP, all interfaces when it is unknown."""
        return self.pod_ip or "0.0.0.0"  # the pod contract: never 127.0.0.1

    @property
    def engine_host(self) -> str:
        """Where the engine listens: ``HOTLOAD_ENGINE_HOST``, else the pod's IP."""
        return self.engine_address or self.pod_ip or "0.0.0.0"


def config_from_pod_env(env: Mapping[str, str], **settings: Any) -> AgentConfig:
    """The agent's config from a sidecar container's environment (the pod contract's names).

    ``env`` is ``os.environ`` for the ``hotload sidecar`` shell, and the environment the pod
    runtime resolved from the pod spec for a shared-mode agent; nothing here reads the
    process environment. ``settings`` set the remaining fields (ports, download sizes).
    """
    required = (ENV_POD_NAME, ENV_POD_NAMESPACE, ENV_DEPLOYMENT)
    missing = [name for name in required if not env.get(name)]
    if missing:
        raise ConfigError("the sidecar needs the pod contract's environment", missing=missing)
    key_id = env.get("AWS_ACCESS_KEY_ID")
    secret = env.get("AWS_SECRET_ACCESS_KEY")
    credentials = None
    if key_id and secret:
        credentials = StorageCredentials(
            access_key_id=key_id,
            secret_access_key=secret,
            session_token=env.get("AWS_SESSION_TOKEN") or None,
        )
    config = AgentConfig(
        pod_name=env[ENV_POD_NAME],
        namespace=env[ENV_POD_NAMESPACE],
        deployment=env[ENV_DEPLOYMENT],
        pod_ip=env.get(ENV_POD_IP) or None,
        engine_address=env.get(ENV_ENGINE_HOST) or None,
        node_name=env.get(ENV_NODE_NAME) or None,
        credentials=credentials,
        root=root_from(env.get(ENV_ROOT)),
    )
    return replace(config, **settings)

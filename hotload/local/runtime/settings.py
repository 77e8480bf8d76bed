"""What one region's pod runtime needs to know, fixed when it starts.

The runtime is one process per region (``hotload local runtime --region NAME``); these
settings are built once by its shell from flags and the region's state directory and
passed down, so nothing below the shell reads the environment.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from hotload.retry import RetryPolicy

#: The ServiceAccount token lifetime a kubelet asks for (3607 s: the apiserver then
#: extends it quietly for clients that do not reload, and we renew at 80 % anyway).
DEFAULT_TOKEN_SECONDS: Final = 3607
#: Where the runtime's own files live inside the region directory.
RUNTIME_DIRNAME: Final = "runtime"
#: The region's Service ports (CONTRACTS.md, "The local regions").
SERVICES_FILENAME: Final = "services.json"
#: Default agent factory of the shared mode: the real sidecar agent with a noop engine.
DEFAULT_AGENT_FACTORY: Final = "hotload.local.runtime.agent_factory:run_sidecar_agent"


@dataclass(frozen=True)
class RestartBackoff:
    """Crash-loop backoff, kubelet's rule and numbers by default: the first restart is
    immediate, then the delays of :attr:`policy` (10 s doubling to 5 min, no jitter); a
    container that ran ``reset_after_s`` starts over."""

    initial_s: float = 10.0
    maximum_s: float = 300.0
    reset_after_s: float = 600.0

    @property
    def policy(self) -> RetryPolicy:
        """The delays after the first restart: the one backoff, doubling without jitter."""
        return RetryPolicy(initial_s=self.initial_s, maximum_s=self.maximum_s, jitter=0.0)

    def delay(self, restart: int, ran_for_s: float) -> float:
        """Seconds to wait before restart number ``restart`` (1 = the first restart)."""
        if restart <= 1 or ran_for_s >= self.reset_after_s:
            return 0.0
        return self.policy.ceiling(restart - 2)


@dataclass(frozen=True)
class RuntimeSettings:
    """One region's runtime: who it is, where its files are, how it talks to its apiserver."""

    region: str
    index: int
    """The region's address index i: its pods get addresses in ``127.i.0.0/16``."""
    region_dir: Path
    """The region's state directory (``$HOTLOAD_STATE/<name>``)."""
    kubeconfig: Path
    """The admin kubeconfig of the local regions (one context per region)."""
    context: str | None = None
    backoff: RestartBackoff = field(default_factory=RestartBackoff)
    token_seconds: int = DEFAULT_TOKEN_SECONDS
    stop_grace_s: float = 10.0
    """Upper bound on each container's grace when the runtime itself stops (``down``)."""
    agent_factory: str = DEFAULT_AGENT_FACTORY
    """``module:function`` the shared-mode hosts run for each pod."""
    hotload_executable: Path = field(
        default_factory=lambda: Path(sys.executable).parent / "hotload"
    )
    """Our console script: a container's ``hotload`` resolves to it (same environment)."""
    python_executable: Path = field(default_factory=lambda: Path(sys.executable))
    base_env: Mapping[str, str] = field(default_factory=dict)
    """The runtime's own environment as its shell read it; containers inherit only the
    few names in ``environment.BASE_ENV_NAMES`` (``PATH``, ``HOME``, locale ...)."""

    @property
    def runtime_dir(self) -> Path:
        return self.region_dir / RUNTIME_DIRNAME

    @property
    def pods_dir(self) -> Path:
        """One directory per pod (volumes, container roots, logs, kubeconfig)."""
        return self.pods_dir_of(self.region_dir)

    @staticmethod
    def pods_dir_of(region_dir: Path) -> Path:
        """The pods directory of the region whose state is ``region_dir``."""
        return region_dir / RUNTIME_DIRNAME / "pods"

    @property
    def processes_dir(self) -> Path:
        """The ledger of process groups we started, for cleanup after a crash."""
        return self.runtime_dir / "processes"

    @property
    def services_file(self) -> Path:
        return self.region_dir / SERVICES_FILENAME

    @property
    def hosts_dir(self) -> Path:
        """Logs of the shared-mode host processes."""
        return self.runtime_dir / "hosts"

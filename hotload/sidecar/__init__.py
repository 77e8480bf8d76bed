"""The per-pod weight-swap agent and its OpenAI-compatible front."""

from hotload.retry import RetryPolicy
from hotload.sidecar.agent import SidecarAgent
from hotload.sidecar.config import AgentConfig

__all__ = ["AgentConfig", "RetryPolicy", "SidecarAgent"]

"""The per-pod weight-swap agent and its OpenAI-compatible front."""

from hotload.sidecar.agent import SidecarAgent
from hotload.sidecar.config import AgentConfig, RetryPolicy

__all__ = ["AgentConfig", "RetryPolicy", "SidecarAgent"]

"""The per-pod weight-swap agent and its OpenAI-compatible front."""

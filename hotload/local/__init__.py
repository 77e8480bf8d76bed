"""Local regions (control plane on loopback) and the pod runtime that runs our containers."""

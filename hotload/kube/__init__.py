"""Kubernetes client loading and API error mapping (KUBECONFIG, else in-cluster)."""

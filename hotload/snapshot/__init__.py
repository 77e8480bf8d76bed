"""Snapshot layout, manifest, lossless delta codec and chain planning (no Kubernetes here)."""

"""kopf operator: workloads, snapshot rollout, ledger, fallback (a later issue)."""

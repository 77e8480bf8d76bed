"""The operator (kopf): renders each RolloutDeployment's workload, rolls its target
snapshot out, keeps every PolicySnapshot's ledger and Ready latch, moves the target back
when it turns out broken or is deleted (the ``rollback`` record), and writes only under
the region's leader Lease. docs/architecture.md ("The operator") names its loop, view,
planner and executor; docs/operator.md says what it does."""

"""Reference workloads the harness ships into runs (used when no --chaos-workload is given)."""

"""Injectable faults, one module per family; chaos.faults.catalog lists the kinds."""

"""Root conftest: the chaos plugin itself is registered through the pytest11 entry point."""

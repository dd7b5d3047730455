import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import os  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def local_ports():
    """Ports for the servers a test starts (moto, the storage fault proxy): this xdist worker's
    own slice of the embedded clusters' range, so two workers never pick the same free port in
    the instant between looking and binding."""
    from chaos.embedded.cluster import SLOTS, free_port, port_slice

    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    ports = port_slice(int(worker[2:]) % SLOTS if worker[2:].isdigit() else 0)
    return lambda: free_port(ports)

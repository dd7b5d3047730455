"""Fixtures for tests against real embedded test hosts (root + namespaces required).

Each test gets its own network on a test-only bridge and a small slice of the test-host
range, so it can run beside an embedded cluster on the default bridge; the finalizer
tears the network down and then sweeps by name, so a failing test leaves nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chaos.embedded.testhost import TestHostNetwork, testhosts_supported
from chaos.transport.ssh import SSHTransport

# One bridge per pytest-xdist worker (make test runs two): N = 0, 1, ... -> rctest<N>,
# 198.18.0.<240 - 16N>/28 — inside the test-host range, clear of the default hosts at .2 and up.
_N = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
BRIDGE = f"rctest{_N}"
SUBNET = f"198.18.0.{240 - 16 * _N}/28"


def pytest_collection_modifyitems(items):
    ok, reason = testhosts_supported()
    if not ok:
        here = Path(__file__).parent
        for item in items:
            if here in item.path.parents:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def network(tmp_path_factory):
    """A fresh, up TestHostNetwork; torn down (and swept) even when the test fails."""
    net = TestHostNetwork(tmp_path_factory.mktemp("h"), bridge=BRIDGE, subnet=SUBNET, boot_delay=0.2, boot_timeout=10)
    try:
        yield net.up()
    finally:
        try:
            net.close()
        finally:
            TestHostNetwork.sweep(BRIDGE)


@pytest.fixture
def host(network):
    """One booted host whose workload is a tiny HTTP server on port 8000."""
    h = network.add_host("rc-t-1", workload=["python3", "-m", "http.server", "-b", "0.0.0.0", "8000"])
    h.boot()
    return h


@pytest.fixture
def ssh(network, host):
    """An SSH transport to ``host`` with its key verified against the network's known_hosts."""
    t = SSHTransport(host.address, key_filename=network.ssh_key_path, known_hosts=network.known_hosts_path,
                     use_agent=False, connect_timeout=3, command_timeout=10)
    yield t
    t.close()


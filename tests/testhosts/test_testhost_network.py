"""Partitions and teardown: what the network leaves behind, even after failures and crashes."""

from __future__ import annotations

import errno
import os
import select
import socket
import subprocess
import sys
import textwrap

import pytest

from chaos.embedded import netns
from chaos.embedded.testhost import TestHostNetwork
from testhost_waits import wait_listening


def reachable(address: str, port: int, timeout: float = 0.5) -> bool:
    try:
        socket.create_connection((address, port), timeout).close()
        return True
    except OSError:
        return False


def test_partition_cuts_the_host_off_and_heal_restores_it(host):
    wait_listening(host.address, 8000)
    host.partition()
    host.partition()  # idempotent
    assert host.is_partitioned()
    assert not reachable(host.address, 8000) and not reachable(host.address, 22)
    host.heal()
    host.heal()  # idempotent
    assert not host.is_partitioned() and netns.filter_rules(host.netns) == []
    assert reachable(host.address, 8000) and reachable(host.address, 22)


def test_partition_also_cuts_traffic_from_the_host_to_the_head(network, host):
    with socket.create_server((network.head_address, 0)) as server:
        port = server.getsockname()[1]
        probe = ["nsenter", "-t", str(host.pids()["init"]), "-n", "python3", "-c",
                 f"import socket; socket.create_connection(('{network.head_address}', {port}), 0.5)"]
        assert subprocess.run(probe, capture_output=True).returncode == 0
        host.partition()
        assert subprocess.run(probe, capture_output=True).returncode != 0


def test_partitioned_host_still_boots(host):
    """Readiness comes from inside the host, so booting never needs the network."""
    host.partition()
    host.power_cycle()
    host.wait_up(after_boot=1, timeout=10)
    assert not reachable(host.address, 22)


def test_heal_needs_only_the_netns_name(host):
    """After a crashed session there is no TestHost object, only the netns."""
    host.partition()
    netns.heal(host.netns)
    assert netns.filter_rules(host.netns) == []


def leftovers(bridge: str) -> dict:
    return {"netns": netns.netns_names(f"{bridge}-"), "bridge": netns.link_exists(bridge),
            "veths": [n for n in os.listdir("/sys/class/net") if n.startswith(f"{bridge}v")]}


NOTHING = {"netns": [], "bridge": False, "veths": []}


def test_teardown_leaves_nothing_even_when_the_body_raises(network):
    net, bridge = network, network.bridge.name
    with pytest.raises(RuntimeError, match="test body failed"):
        with net:
            hosts = [net.add_host(f"rc-t-{i}", workload=["sleep", "infinity"]) for i in (1, 2)]
            for h in hosts:
                h.boot()
            hosts[0].partition()
            pids = [pid for h in hosts for pid in h.namespace_pids()]
            assert len(pids) >= 6
            raise RuntimeError("test body failed")
    assert leftovers(bridge) == NOTHING
    assert [pid for pid in pids if os.path.exists(f"/proc/{pid}")] == []
    mounts = open("/proc/self/mountinfo").read()
    assert str(net.state_dir) not in mounts and f"{bridge}-rc-t-" not in mounts


def test_a_gone_test_host_is_unreachable_from_this_machine_not_sent_out(network, host):
    """Traffic for the subnet of a bridge that is gone fails here at once; without the bridge's
    "unreachable" route it took the default route off the machine (an egress proxy answered)."""
    wait_listening(host.address, 8000)
    network.close()
    assert not netns.link_exists(network.bridge.name)
    route = subprocess.run(["ip", "route", "get", host.address], capture_output=True, text=True)
    assert route.returncode != 0 and "No route to host" in route.stderr, route.stdout + route.stderr
    with pytest.raises(OSError) as refused:
        socket.create_connection((host.address, 8000), timeout=5)
    assert refused.value.errno == errno.EHOSTUNREACH, refused.value


CRASHING_SESSION = textwrap.dedent("""
    import os, sys
    from chaos.embedded.testhost import TestHostNetwork
    net = TestHostNetwork(sys.argv[1], bridge=sys.argv[2], subnet=sys.argv[3]).up()
    host = net.add_host("rc-t-1", workload=["sleep", "infinity"])
    host.boot()
    host.partition()
    print(host.pids()["init"], flush=True)
    os._exit(1)  # no teardown at all, as if the session were killed
""")


def test_crashed_session_kills_hosts_and_sweep_removes_the_rest(network):
    bridge = network.bridge.name
    network.close()  # the crashing session below builds the same network on its own
    p = subprocess.run([sys.executable, "-c", CRASHING_SESSION, str(network.state_dir), bridge, str(network.subnet)],
                       capture_output=True, text=True, timeout=30)
    init = int(p.stdout)
    ns, veth = f"{bridge}-rc-t-1", f"{bridge}v2"
    assert leftovers(bridge) == {"netns": [ns], "bridge": True, "veths": [veth]}
    # The host dies with its session (parent-death signal), before any sweep.
    try:
        fd = os.pidfd_open(init)
    except ProcessLookupError:
        pass
    else:
        assert select.select([fd], [], [], 5)[0], f"host init {init} outlived its crashed session"
        os.close(fd)
    assert netns.is_partitioned(ns)
    assert TestHostNetwork.sweep(bridge) == [f"veth {veth}", f"netns {ns}", f"bridge {bridge}"]
    assert leftovers(bridge) == NOTHING

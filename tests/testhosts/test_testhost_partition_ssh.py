"""A partition made over SSH on a host with no console (chaos.faults.partition, chains mode):
the host's other traffic is cut while SSH stays up, the harness heals it over SSH, the host
heals itself if the harness never does, and the sweep removes what a killed session left."""

from __future__ import annotations

import socket
import types

import pytest

from chaos.faults.base import Injection
from chaos.faults.partition import Partition
from chaos.transport.ssh import SSHTransport
from chaos.waits import poll_until


@pytest.fixture
def served(network):
    """A host serving HTTP on port 8000 (the traffic a partition must cut), and SSH to it."""
    host = network.add_host("rc-part-1", workload=["python3", "-m", "http.server", "-b", "0.0.0.0", "8000"])
    host.boot()
    t = SSHTransport(host.address, key_filename=network.ssh_key_path, known_hosts=network.known_hosts_path,
                     use_agent=False, connect_timeout=5, command_timeout=20)
    poll_until(lambda: (reachable(host.address), "port 8000 closed"), 15, "the host's HTTP server")
    yield host, t
    t.close()


def reachable(address: str, port: int = 8000) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


def injection(host, transport, fault):
    inj = Injection(fault, target=types.SimpleNamespace(node_ip=host.address), host=types.SimpleNamespace(
        console=None, transport=transport, key=host.address, name=host.name))
    fault.revert_plan(inj)  # names the chains, as the ledger entry written first does
    return inj


def test_a_cut_over_ssh_keeps_ssh_drops_the_rest_and_heals(served):
    host, t = served
    fault = Partition(rank=1)
    inj = injection(host, t, fault)
    ctx = types.SimpleNamespace(timeline=types.SimpleNamespace(emit=lambda *a, **k: None))
    details = fault.inject(ctx, inj)
    assert details["ssh"] == "kept" and fault.is_partitioned(inj)
    assert not reachable(host.address), "port 8000 still answers through the cut"
    assert t.run("echo still here", timeout=10).check().stdout.strip() == "still here"
    assert fault.revert(ctx, inj) is True and not fault.is_partitioned(inj)
    assert reachable(host.address)
    timer = details["timer_pid"]
    # Killed by the revert; exited once it is gone or a zombie (the host's init reaps it in its
    # own time: under CI's load a look right after the kill once still saw it).
    state = f"s=$(awk '/^State:/ {{print $2}}' /proc/{timer}/status 2>/dev/null); [ -z \"$s\" ] || [ \"$s\" = Z ] " \
            "&& echo gone || echo alive"
    poll_until(lambda: (t.run(state, timeout=10).check().stdout.strip() == "gone", "still running"), 10,
               f"the self-heal timer (pid {timer}) to end with the heal")


def test_twin_the_host_heals_itself_when_the_harness_never_does(served):
    host, t = served
    fault = Partition(rank=1, self_heal_s=2)
    inj = injection(host, t, fault)
    fault.inject(types.SimpleNamespace(), inj)
    assert not reachable(host.address)
    poll_until(lambda: (reachable(host.address), "still cut"), 20, "the host to heal itself")
    assert not fault.is_partitioned(inj)


def test_the_sweep_heals_what_a_killed_session_left(served):
    host, t = served
    fault = Partition(rank=1)
    inj = injection(host, t, fault)
    fault.inject(types.SimpleNamespace(), inj)
    plan = fault.revert_plan(inj)
    backend = types.SimpleNamespace(connect=lambda key: SSHTransport(
        key, key_filename=host.network.ssh_key_path, known_hosts=host.network.known_hosts_path, use_agent=False))
    assert Partition.sweep(plan, backend) is True and reachable(host.address)
    assert Partition.sweep(plan, backend) is False  # nothing left to heal

"""A preemption the fault ends itself (a drain request: Ray never kills a drained node; a
SIGKILL after a grace period) leaves a revert plan, so a session stopped before that kill
does not leave the node draining for good: revert and `ray-chaos sweep` kill the raylet of
that exact node id, and do nothing once it is gone.  The "raylet" is a process of this test
whose command line names a node id, as Ray's does (started and stopped by PID)."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from chaos.faults.base import Injection
from chaos.faults.preempt import Preempt
from chaos.transport.local import LocalTransport
from chaos.waits import poll_until


@pytest.fixture
def raylet(tmp_path):
    """A process whose command line reads `.../raylet/raylet ... --node_id=<id>`."""
    (tmp_path / "raylet").mkdir()
    binary = tmp_path / "raylet" / "raylet"
    binary.symlink_to(sys.executable)
    node_id = "c0ffee" + os.urandom(8).hex()
    p = subprocess.Popen([str(binary), "-c", "import time; time.sleep(600)", f"--node_id={node_id}"])
    yield p, node_id
    if p.poll() is None:
        p.kill()
    p.wait(timeout=10)


def injection(fault, node_id):
    return Injection(fault, target=types.SimpleNamespace(node_id=node_id, node_ip="127.0.0.1"),
                     host=types.SimpleNamespace(transport=LocalTransport(), key="h1", name="h1", console=None))


def test_a_drained_node_the_session_never_killed_is_ended_by_revert(raylet):
    p, node_id = raylet
    fault = Preempt(rank=1, via="drain", deadline_s=8)
    inj = injection(fault, node_id)
    plan = fault.revert_plan(inj)
    assert plan["action"] == "end-preempted-node" and plan["node_id"] == node_id
    assert fault.revert(types.SimpleNamespace(), inj) is True
    poll_until(lambda: (p.poll() is not None, "still running"), 10, f"the raylet of node {node_id[:8]} to end")
    # twin: the node already went (killed at its deadline): nothing to revert
    assert fault.revert(types.SimpleNamespace(), inj) is False


def test_the_sweep_ends_it_from_the_ledger_plan(raylet):
    p, node_id = raylet
    fault = Preempt(rank=1, via="sigterm", kill_after_s=3)
    plan = fault.revert_plan(injection(fault, node_id))
    backend = types.SimpleNamespace(connect=lambda key: LocalTransport(key))
    assert Preempt.sweep(plan, backend) is True
    poll_until(lambda: (p.poll() is not None, "still running"), 10, f"the raylet of node {node_id[:8]} to end")
    assert Preempt.sweep(plan, backend) is False


def test_a_sigterm_that_ray_ends_itself_leaves_nothing_to_revert(raylet):
    p, node_id = raylet
    fault = Preempt(rank=1, via="sigterm")
    inj = injection(fault, node_id)
    assert fault.revert_plan(inj)["action"] == "none"
    assert fault.revert(types.SimpleNamespace(), inj) is False and p.poll() is None

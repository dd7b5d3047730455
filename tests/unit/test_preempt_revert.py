"""A preemption the fault ends itself (a drain request: Ray never kills a drained node; a
SIGKILL after a grace period) leaves a revert plan, so a session stopped before that kill
does not leave the node draining for good: revert and `ray-chaos sweep` kill the raylet of
that exact node id, and do nothing once it is gone.  The "raylet" is a process of this test
whose command line names a node id, as Ray's does (started and stopped by PID)."""

from __future__ import annotations

import os
import time
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


PARENT = """
import signal, subprocess, sys
raylet = subprocess.Popen([sys.argv[1], "-c", "import sys, time; time.sleep(float(sys.argv[1]))", sys.argv[2],
                           "--node_id=" + sys.argv[3]])
signal.signal(signal.SIGTERM, lambda *a: (raylet.kill(), raylet.wait(), sys.exit(0)))
raylet.wait()
signal.pause()  # as `ray start --block` does after a raylet that exited 0: block on
"""


@pytest.fixture
def ray_start(tmp_path):
    """A stand-in `ray start --block` whose child is a stand-in raylet of a node id; the raylet
    exits 0 after ``life`` seconds (a drained node ending itself) — started and stopped by PID."""
    procs = []

    def start(life: float):
        (tmp_path / "raylet").mkdir(exist_ok=True)
        binary = tmp_path / "raylet" / "raylet"
        if not binary.exists():
            binary.symlink_to(sys.executable)
        node_id = "c0ffee" + os.urandom(8).hex()
        p = subprocess.Popen([sys.executable, "-c", PARENT, str(binary), str(life), node_id, "start", "--block"])
        procs.append(p)
        return p, node_id

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


def test_a_drained_node_that_ended_itself_has_its_ray_start_ended_as_the_instance_would_go(ray_start):
    from chaos.faults.preempt import RAY_START_OF_NODE

    p, node_id = ray_start(life=2.0)
    fault = Preempt(rank=1, via="drain", deadline_s=8)
    inj = injection(fault, node_id)
    found = poll_until(lambda: ((out := inj.host.transport.run(RAY_START_OF_NODE.format(node_id=node_id)).stdout.split())
                                and int(out[0]), "no raylet yet"), 10, "the stand-in raylet")
    assert found == p.pid
    inj.evidence["ray_start_pid"] = found
    details = fault._kill_at(inj, time.time() + 4)  # the raylet exits 0 at +2 s, before the deadline
    assert details["at_deadline"] == "the node had shut down already" and details["ray_start"] == "ended", details
    poll_until(lambda: (p.poll() is not None, "still blocking"), 10, "the stand-in ray start to end")


def test_at_the_deadline_a_running_raylet_is_killed_and_its_ray_start_left_to_see_it(ray_start):
    p, node_id = ray_start(life=600)
    fault = Preempt(rank=1, via="drain", deadline_s=8)
    inj = injection(fault, node_id)
    inj.evidence["ray_start_pid"] = p.pid
    poll_until(lambda: (fault.revert_plan(inj) and inj.host.transport.run(
        f"pgrep -f -- '--node_id={node_id}'").ok, "no raylet yet"), 10, "the stand-in raylet")
    details = fault._kill_at(inj, time.time())
    assert details["raylet_pid"] and "ray_start" not in details, details
    assert p.poll() is None, "ray start was ended though its raylet was still there to kill"

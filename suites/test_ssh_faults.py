"""Faults over SSH on test hosts: reboots, raylet SIGKILL, rank kill, network partition.

Needs hosts reached over SSH: the embedded cluster's test hosts (--chaos-hosts namespaces,
root), where each worker node lives in its own network/PID/mount/UTS namespaces with sshd,
a host key the harness verifies and a boot id that changes at every boot — or a profile's
hosts with ssh access.  The expected charge (one worker-group failure per fault) and the
SLOs follow from the faults and the profile.
"""

import pytest

from chaos.faults.partition import Partition
from chaos.faults.raylet import RayletKill
from chaos.faults.reboot import NodeReboot
from chaos.faults.worker import TrainWorkerKill
from chaos.transport.ssh import SSHTransport
from chaos.triggers import AfterCheckpoint

pytestmark = pytest.mark.chaos

# What runs under a PID on the host: its command line, or "gone" (a zombie is dead already).
PID_STATE = r"""
p={pid}
s=$(cat /proc/$p/stat 2>/dev/null) || {{ echo gone; exit 0; }}
case "${{s##*) }}" in Z*) echo gone; exit 0;; esac
tr '\0' ' ' < /proc/$p/cmdline
"""


@pytest.fixture
def hosts(chaos):
    """The worker hosts, when they are reached over SSH (embedded test hosts, or a profile's)."""
    workers = chaos.env.cluster.alive_workers()
    if not workers or not isinstance(chaos.env.backend.host(workers[0].node_id).transport, SSHTransport):
        pytest.skip("needs hosts reached over SSH: embedded test hosts (--chaos-hosts namespaces, as root) "
                    "or a profile with ssh access")
    return workers


def workload(chaos, num_workers=2):
    return chaos.workload(num_workers=num_workers, max_failures=3, steps=20, checkpoint_every=5)


def pid_state(inj, pid: int) -> str:
    """What runs under ``pid`` on the injection's host now, asked over the host's transport."""
    return inj.host.transport.run(PID_STATE.format(pid=int(pid)), timeout=30).check().stdout.strip()


def assert_rank_moved(outcome, inj):
    """The next attempt runs the killed rank under another (node id, pid): PIDs alone repeat
    across test hosts' PID namespaces."""
    killed = (inj.target.node_id, inj.target.pid)
    attempts = outcome.timeline.attempts()
    assert len(attempts) >= 2, f"no attempt after the fault: {[a.describe() for a in attempts]}"
    after = next((p["node_id"], p["pid"]) for p in attempts[1].data["placement"] if p["rank"] == inj.target.rank)
    assert after != killed, f"rank {inj.target.rank} still runs as {killed} after the fault"


def assert_rebooted(outcome, inj):
    ev = inj.evidence
    assert ev["boot_id_after"] != ev["boot_id_before"], ev
    assert ev["new_node_id"] != ev["old_node_id"], ev
    kinds = [e.kind for e in outcome.timeline.events if e.kind in ("reboot_issued", "ssh_down", "ssh_up", "node_rejoined")]
    assert kinds == ["reboot_issued", "ssh_down", "ssh_up", "node_rejoined"], kinds


def assert_reverted(outcome):
    """Every injected fault has its revert on the timeline (the healed verdict, which
    assert_verdicts checked, sees the cluster; this sees each fault's own revert)."""
    reverted = {e.data["ledger_id"] for e in outcome.timeline.of("fault_reverted")}
    injected = [e.data["ledger_id"] for e in outcome.timeline.of("fault_injected")]
    assert injected and set(injected) <= reverted, f"faults not reverted: {set(injected) - reverted}"


def test_reboot_rank_1_node_without_spare_capacity(chaos, hosts):
    """Every host runs a rank: training resumes only after the rebooted host rejoins."""
    outcome = chaos.run(workload(chaos, num_workers=len(hosts)), faults=[(AfterCheckpoint(2), NodeReboot(rank=1))])
    outcome.assert_verdicts()
    [inj] = outcome.injections
    assert_rebooted(outcome, inj)
    rejoined = outcome.timeline.first("node_rejoined")
    resumed = outcome.timeline.reports(attempt=1)[0]
    assert resumed.t > rejoined.t - 2.0, "training resumed before the rebooted host was back"
    assert_reverted(outcome)


@pytest.mark.extended
def test_raylet_sigkill_then_reboot_over_ssh(chaos, hosts):
    """Two faults on rank 1's node in one run, spare capacity for each restart.  The raylet
    PID that was killed no longer runs that node's raylet on its host, and rank 1 runs on in
    another process; then the node of rank 1 reboots (new boot id, new node id)."""
    outcome = chaos.run(chaos.workload(num_workers=2, max_failures=3, steps=30, checkpoint_every=5),
                        faults=[(AfterCheckpoint(2), RayletKill(rank=1, method="sigkill")),
                                (AfterCheckpoint(4), NodeReboot(rank=1))])
    outcome.assert_verdicts()
    killed, rebooted = outcome.injections
    raylet_pid = chaos.env.ledger.entries()[killed.ledger_id]["raylet_pid"]
    # Node recovery may have rebooted the host into a fresh PID namespace where the number is
    # taken again: what must be gone is that node's raylet under it.
    now = pid_state(killed, raylet_pid)
    assert f"--node_id={killed.target.node_id}" not in now, (
        f"PID {raylet_pid} on {killed.host.name or killed.host.key} still runs the raylet of node "
        f"{killed.target.node_id[:8]}")
    assert_rank_moved(outcome, killed)
    assert_rebooted(outcome, rebooted)
    assert_reverted(outcome)


def test_rank_kill_then_partition_over_ssh(chaos, hosts):
    """Two faults on rank 1 in one run, each charged to max_failures.  A SIGKILL of the rank's
    process: its PID is gone from its host and the next attempt runs rank 1 in a new
    process.  Then its host cut off the network until Ray declares the node dead, and healed:
    out of band through the host's console where it has one (test hosts), else over SSH,
    which the cut keeps (a profile's hosts)."""
    faults = [(AfterCheckpoint(2), TrainWorkerKill(rank=1)), (AfterCheckpoint(4), Partition(rank=1))]
    # baseline=True: both restarts followed step by step against a fault-free run (state-trajectory).
    outcome = chaos.run(chaos.workload(num_workers=2, max_failures=3, steps=30, checkpoint_every=5), faults=faults,
                        expect=chaos.expect(baseline=True))
    outcome.assert_verdicts()
    trajectory = outcome.verdict("state-trajectory")
    assert trajectory.status == "pass", trajectory.line()
    killed, partitioned = outcome.injections
    assert pid_state(killed, killed.target.pid) == "gone", (
        f"rank 1's PID {killed.target.pid} still runs on {killed.host.name or killed.host.key} after SIGKILL")
    assert_rank_moved(outcome, killed)
    assert outcome.timeline.first("partition_healed") is not None
    assert not partitioned.fault.is_partitioned(partitioned), "partition rules still in place"
    assert_reverted(outcome)

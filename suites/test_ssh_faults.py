"""Faults over SSH on test hosts: reboots, raylet SIGKILL, rank kill, network partition.

Needs the embedded cluster's test hosts (--chaos-hosts namespaces, root): each worker
node lives in its own network/PID/mount/UTS namespaces with sshd, a host key the harness
verifies and a boot id that changes at every boot.
"""

import pytest

from chaos.faults.partition import Partition
from chaos.faults.raylet import RayletKill
from chaos.faults.reboot import NodeReboot
from chaos.faults.worker import TrainWorkerKill
from chaos.transport.ssh import SSHTransport
from chaos.triggers import AfterCheckpoint

pytestmark = pytest.mark.chaos


@pytest.fixture
def hosts(chaos):
    """The worker hosts, when they are reached over SSH (embedded test hosts, or a profile's)."""
    workers = chaos.env.cluster.alive_workers()
    if not workers or not isinstance(chaos.env.transport_for(workers[0].ip), SSHTransport):
        pytest.skip("needs hosts reached over SSH: embedded test hosts (--chaos-hosts namespaces, as root) "
                    "or a profile with ssh access")
    return workers


def assert_rebooted(outcome, fault):
    ev = fault.evidence
    assert ev["boot_id_after"] != ev["boot_id_before"], ev
    assert ev["new_node_id"] != ev["old_node_id"], ev
    kinds = [e.kind for e in outcome.timeline.events if e.kind in ("reboot_issued", "ssh_down", "ssh_up", "node_rejoined")]
    assert kinds == ["reboot_issued", "ssh_down", "ssh_up", "node_rejoined"], kinds


def assert_reverted(outcome):
    reverted = {e.data["ledger_id"] for e in outcome.timeline.of("fault_reverted")}
    injected = [e.data["ledger_id"] for e in outcome.timeline.of("fault_injected")]
    assert injected and set(injected) <= reverted, f"faults not reverted: {set(injected) - reverted}"
    assert outcome.verdict("healed").status == "pass", outcome.verdict("healed").message


def test_reboot_rank_1_node_without_spare_capacity(chaos, hosts):
    """Every host runs a rank: training resumes only after the rebooted host rejoins."""
    fault = NodeReboot(rank=1)
    outcome = chaos.run(
        chaos.workload(num_workers=len(hosts), max_failures=3, steps=30, checkpoint_every=5),
        faults=[(AfterCheckpoint(2), fault)],
        expect=chaos.expect(charged={"worker_group": 1}),
    )
    outcome.assert_verdicts()
    assert_rebooted(outcome, fault)
    rejoined = outcome.timeline.first("node_rejoined")
    resumed = outcome.timeline.reports(attempt=1)[0]
    assert resumed.t > rejoined.t - 2.0, "training resumed before the rebooted host was back"
    assert_reverted(outcome)


def test_reboot_rank_1_node_with_spare_capacity(chaos, hosts):
    fault = NodeReboot(rank=1)
    outcome = chaos.run(
        chaos.workload(num_workers=2, max_failures=3, steps=30, checkpoint_every=5),
        faults=[(AfterCheckpoint(2), fault)],
        expect=chaos.expect(charged={"worker_group": 1}),
    )
    outcome.assert_verdicts()
    assert_rebooted(outcome, fault)
    assert_reverted(outcome)


def test_raylet_sigkill_over_ssh(chaos, hosts):
    outcome = chaos.run(
        chaos.workload(num_workers=2, max_failures=3, steps=30, checkpoint_every=5),
        faults=[(AfterCheckpoint(2), RayletKill(rank=1, method="sigkill"))],
        expect=chaos.expect(charged={"worker_group": 1}),
    )
    outcome.assert_verdicts()
    inj = outcome.timeline.first("fault_injected")
    assert inj is not None
    assert_reverted(outcome)


def test_rank_kill_over_ssh(chaos, hosts):
    outcome = chaos.run(
        chaos.workload(num_workers=2, max_failures=3, steps=30, checkpoint_every=5),
        faults=[(AfterCheckpoint(2), TrainWorkerKill(rank=1))],
        expect=chaos.expect(charged={"worker_group": 1}),
    )
    outcome.assert_verdicts()
    pids = [next(p["pid"] for p in a.data["placement"] if p["rank"] == 1) for a in outcome.timeline.attempts()]
    assert outcome.targets[0].pid == pids[0]
    assert_reverted(outcome)


def test_partition_until_dead_then_heal(chaos, hosts):
    if chaos.env.console_for(hosts[0].ip) is None:
        pytest.skip("a partition is healed out of band: needs a host console (embedded test hosts)")
    outcome = chaos.run(
        chaos.workload(num_workers=2, max_failures=3, steps=30, checkpoint_every=5),
        faults=[(AfterCheckpoint(2), Partition(rank=1))],
        expect=chaos.expect(charged={"worker_group": 1}),
    )
    outcome.assert_verdicts()
    assert outcome.timeline.first("partition_healed") is not None
    assert not chaos.env.console_for(outcome.targets[0].node_ip).is_partitioned(), "partition rules still in place"
    assert_reverted(outcome)

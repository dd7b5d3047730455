"""Automatic node recovery end to end: a GPU fault the node's health agent sees.

The chain starts where the hardware would: an ``xid`` fault makes every CUDA driver call on
rank 1's node fail (the shim, until the node's boot id changes) and writes the NVRM Xid line
to that node's kernel log.  Then every link is the platform's and has its own verdict: the
node agent's condition and node-health label (*node-agent*), HyperPod's reboot or
replacement (*node-recovered*: Ready with a new boot id, or a new node), Ray's node back,
Train's restart from the latest checkpoint (*resumed-from-latest*), and the charge Ray made
of the rank's CUDA error and the node's loss together (*within-budget*: one of the outcomes
measured here).  Every worker node runs a rank (no spare capacity): training waits for the
node, as on a full HyperPod cluster.

Without a profile these run on the embedded Kubernetes cluster, whose HyperPod-like agent
follows each node's kernel log (a stand-in file at /dev/kmsg inside the test host); on a
profile's cluster they observe the platform's own agent (``kubernetes.node_agent``).
"""

import json

import allure
import pytest

from chaos.errors import VerificationError
from chaos.triggers import AfterCheckpoint

pytestmark = [pytest.mark.chaos, pytest.mark.kubernetes]

# What Ray 2.60 charged for an xid in the runs of these suites measured so far (docs/verdicts.md,
# "Which budget a fault costs"): the rank's failure, and in one of 11 runs also a worker-group start
# that timed out while the node's new Ray pod came up (controller_failure_limit).
MEASURED_CHARGES = [{"worker_group": 1}, {"worker_group": 1, "controller": 1}]


@pytest.fixture(autouse=True)
def _reference_workload_only(chaos):
    if chaos.user_workload:
        pytest.skip("the CPU path drives the stub CUDA driver from the reference workload; put your own script "
                    "under an xid on a GPU node")


def run_xid(chaos, cuda_driver_dir, xid, **expect):
    workers = len(chaos.env.cluster.alive_workers())
    return chaos.run(chaos.workload(num_workers=workers, max_failures=4, steps=20, checkpoint_every=5,
                                    device="stub-cuda"),
                     faults=[(AfterCheckpoint(2), chaos.xid(xid=xid, rank=1, driver_dir=cuda_driver_dir))],
                     expect=chaos.expect(**expect))


def attach(outcome):
    [inj] = outcome.injections
    allure.attach(json.dumps(inj.evidence, indent=1, default=str), name="xid evidence: kernel log, agent, node",
                  attachment_type=allure.attachment_type.JSON)
    return inj


def run_chain(chaos, cuda_driver_dir, xid, action):
    """The xid on rank 1's node; every verdict passes and every link was seen, in order, on one
    timeline; the node came back as ``action`` says."""
    outcome = run_xid(chaos, cuda_driver_dir, xid, charge_outcomes=MEASURED_CHARGES)
    inj = attach(outcome)
    outcome.assert_verdicts()
    kinds = [e.kind for e in outcome.timeline.events]
    chain = ["fault_injected", "xid_logged", "node_agent_acted", "node_recovered"]
    assert [k for k in kinds if k in chain] == chain, kinds
    assert outcome.timeline.of("worker_error"), "Train never saw rank 1 fail"
    agent = outcome.verdict("node-agent")
    assert agent.status == "pass" and "XidHardwareFailure" in json.dumps(agent.evidence), agent.line()
    # The dead GPU itself: the shim failed driver calls on the node before it went (the embedded
    # agent acts 1 s after the line, as real agents take a while).
    assert inj.evidence["shim_injections"] >= 1, inj.evidence
    recovered = inj.evidence["recovered"]
    assert recovered["action"] == action, recovered
    if action == "reboot":
        assert recovered["boot_id_after"] != inj.evidence["boot_id_before"], inj.evidence
    else:
        assert recovered["node_after"] != inj.evidence["node"], inj.evidence


def test_xid_48_double_bit_ecc_reboots_the_node(chaos, cuda_driver_dir):
    """Xid 48: the agent sets NvidiaErrorReboot and UnschedulablePendingReboot; HyperPod
    reboots the node (new boot id), its Ray pod comes back, Train resumes on it."""
    run_chain(chaos, cuda_driver_dir, 48, "reboot")


@pytest.mark.extended  # node-replace runs per commit in suites/test_kubernetes_faults.py
def test_xid_79_gpu_off_the_bus_replaces_the_node(chaos, cuda_driver_dir):
    """Xid 79: NvidiaErrorReplace and UnschedulablePendingReplacement; a new node takes the
    old one's place (the profile opted in to replacements) and Train resumes there."""
    run_chain(chaos, cuda_driver_dir, 79, "replace")


def test_a_dead_gpu_nobody_recovers_never_passes(chaos, cuda_driver_dir):
    """Health monitoring off: the Xid line sits in the kernel log, nobody labels the node, the
    GPU stays dead, every restart on it fails until the budget runs out — a finding, never a pass."""
    cluster = chaos.embedded_kubernetes
    if cluster is None:
        pytest.skip("switching the node agent off needs the embedded Kubernetes cluster")
    cluster.agent.set_health_monitoring(False)
    try:
        workers = len(chaos.env.cluster.alive_workers())
        outcome = chaos.run(chaos.workload(num_workers=workers, max_failures=1, steps=20, checkpoint_every=5,
                                           device="stub-cuda"),
                            faults=[(AfterCheckpoint(2), chaos.xid(xid=79, rank=1, driver_dir=cuda_driver_dir,
                                                                   agent_slo_s=15))])
    finally:
        cluster.agent.set_health_monitoring(True)
    attach(outcome)
    with pytest.raises(VerificationError):
        outcome.assert_verdicts()
    errors = [m for e in outcome.timeline.of("worker_error") if e.attempt == 0 for m in e.data["errors"].values()]
    assert any("CUDA error: unknown error" in m for m in errors), errors  # Xid 79's dead GPU, in the rank
    agent = outcome.verdict("node-agent")
    assert agent.status == "fail" and agent.message.startswith(
        "node agent never acted: automatic node recovery did not act on Xid 79 within 15 s: node "), agent.line()
    assert agent.message.endswith("still Schedulable"), agent.message
    assert outcome.verdict("node-recovered").diagnosis == "node not recovered"
    budget = outcome.verdict("within-budget")
    assert budget.diagnosis == "retry budget exhausted" and "max_failures=1" in budget.message, budget.line()
    assert outcome.verdict("healed").status == "pass", outcome.verdict("healed").line()

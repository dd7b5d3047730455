"""Kubernetes and HyperPod faults on a KubeRay RayCluster, through the Kubernetes API.

Without a profile these run on the embedded Kubernetes cluster (emulated API server,
kubelet, KubeRay-like reconciler, HyperPod-like agent and SageMaker endpoint; real Ray in
real test hosts), which the session starts for the ``kubernetes`` marker; with a profile,
on its cluster when it has a ``kubernetes`` section, else the fault factories skip saying why.  Every suite asserts the verdicts and attaches
the Kubernetes evidence (pods before/after, node, boot ids) the fault recorded.

Budgets, measured on Ray 2.60 (docs/verdicts.md, "Which budget a fault costs"): a hard pod delete,
a raylet kill and a HyperPod reboot/replace kill the node at once → ``max_failures``.  A
graceful delete or eviction SIGTERMs ``ray start --block`` (Ray drains the node as a
preemption), then the kubelet SIGKILLs it when the pod's grace ends: the embedded pods'
grace (8 s) ends inside Ray's drain window (10 s), which Ray 2.60 charges to
``max_failures`` — the harness must report that as the wrong budget class.
"""

import json

import allure
import pytest

from chaos.faults.raylet import RayletKill
from chaos.triggers import AfterCheckpoint, AtStep

pytestmark = [pytest.mark.chaos, pytest.mark.kubernetes]


def attach_evidence(outcome):
    for inj in outcome.injections:
        allure.attach(json.dumps(inj.evidence, indent=1, default=str), name=f"kubernetes evidence: {inj.fault.kind}",
                      attachment_type=allure.attachment_type.JSON)


def assert_only_wrong_class(outcome, n):
    """Everything holds but the budget class: Ray charged max_failures for ``n`` preemptions."""
    budget = outcome.verdict("within-budget")
    assert budget.status == "fail" and budget.diagnosis == "charged to the wrong budget class", budget.line()
    assert budget.message.count("was charged to max_failures") == n, budget.message  # each fault named
    others = [v.line() for v in outcome.verdicts if v is not budget and v.fails()]
    assert not others, others


def test_hard_pod_delete_hyperpod_reboot_and_replace(chaos):
    """Three node losses in one run, each charged to max_failures, each restart on the spare
    node.  ``kubectl delete pod --grace-period=0 --force`` of rank 1's pod: KubeRay replaces
    the pod (a new name).  The HyperPod reboot label on rank 1's node: its pod dies with it
    and the node comes back (new boot id) with a new Ray pod.  The replacement label: the
    node object goes and a new node (new name) joins."""
    outcome = chaos.run(chaos.workload(num_workers=2, max_failures=3, steps=40, checkpoint_every=5),
                        faults=[(AfterCheckpoint(2), chaos.pod_delete(rank=1)),
                                (AfterCheckpoint(4), chaos.hyperpod_reboot(rank=1, recover_timeout_s=120)),
                                (AfterCheckpoint(6), chaos.node_replace(rank=1, recover_timeout_s=120))])
    attach_evidence(outcome)
    outcome.assert_verdicts()
    assert [i.fault.kind for i in outcome.injections] == ["pod-delete", "hyperpod-reboot", "node-replace"], \
        [i.fault.kind for i in outcome.injections]
    deleted, rebooted, replaced = outcome.injections
    pod = deleted.evidence["pod"].split("/", 1)[1]
    assert pod in deleted.evidence["pods_before"] and pod not in deleted.evidence["pods_after"], deleted.evidence
    assert rebooted.evidence["boot_id_after"] != rebooted.evidence["boot_id_before"], rebooted.evidence
    assert replaced.evidence["new_node"] and replaced.evidence["new_node"] != replaced.evidence["node"], \
        replaced.evidence


def test_graceful_delete_eviction_and_drain_killed_inside_the_drain_window(chaos):
    """The three graceful removals of rank 1's pod, one after another in one run: a graceful
    delete, an eviction through the Eviction API (what a drain does per pod), then
    ``kubectl drain`` of its node (cordoned, the replacement pod Pending until the revert
    uncordons it).  Each time Train hears the drain (PREEMPTING), the kubelet's SIGKILL comes
    before Ray's window ends, and Ray 2.60 charges max_failures (see the module docstring).
    Training goes on while a node drains (8 s, up to 27 steps of 0.3 s), so each later fault
    waits for its step in the attempt after the previous restart."""
    outcome = chaos.run(
        chaos.workload(num_workers=2, max_failures=3, max_preemption_failures=3, steps=110, checkpoint_every=5),
        faults=[(AfterCheckpoint(2), chaos.pod_delete_graceful(rank=1)),
                (AtStep(45, fresh=True), chaos.pod_evict(rank=1)),
                (AtStep(80, fresh=True), chaos.drain(rank=1))])
    attach_evidence(outcome)
    assert [i.fault.kind for i in outcome.injections] == ["pod-delete-graceful", "pod-evict", "drain"], \
        [i.fault.kind for i in outcome.injections]
    graceful, evicted, drained = outcome.injections
    assert graceful.evidence["sigkill_inside_window"] is True, graceful.evidence
    assert evicted.evidence["eviction_attempts"] >= 1 and evicted.evidence["sigkill_inside_window"] is True, \
        evicted.evidence
    states = [e.data.get("cur") for e in outcome.timeline.of("state_changed")]
    assert states.count("PREEMPTING") >= 3, f"Train did not see each drain notice: states {states}"
    assert_only_wrong_class(outcome, 3)
    node = chaos.env.backend.kube.node(drained.evidence["node"])
    assert not (node.get("spec") or {}).get("unschedulable"), f"{drained.evidence['node']} is still cordoned"


@pytest.mark.extended
def test_hyperpod_reboot_by_label_without_spare_capacity(chaos):
    """Every worker node runs a rank; the node-health label reboots rank 1's node: its pod
    dies with it, training waits until the node is back (new boot id) with a new Ray pod."""
    workers = len(chaos.env.cluster.alive_workers())
    outcome = chaos.run(chaos.workload(num_workers=workers, max_failures=2, steps=20, checkpoint_every=5),
                        faults=[(AfterCheckpoint(2), chaos.hyperpod_reboot(rank=1, recover_timeout_s=120))])
    attach_evidence(outcome)
    outcome.assert_verdicts()
    [inj] = outcome.injections
    assert inj.evidence["boot_id_after"] != inj.evidence["boot_id_before"], inj.evidence


@pytest.mark.extended
def test_raylet_kill_through_exec_then_hyperpod_reboot_through_boto3(chaos):
    """Two faults on rank 1's node in one run.  SIGKILL of its raylet by exec into its pod:
    ``ray start --block`` exits, the pod fails and KubeRay replaces it; Train restarts on the
    spare node.  Then ``batch_reboot_cluster_nodes`` through boto3 against the SageMaker API
    reboots the node rank 1 runs on next (new boot id)."""
    if chaos.env.backend.kube is None:
        pytest.skip(f"needs the Kubernetes API: this session's backend is {chaos.env.backend.label}")
    outcome = chaos.run(chaos.workload(num_workers=2, max_failures=3, steps=30, checkpoint_every=5),
                        faults=[(AfterCheckpoint(2), RayletKill(rank=1, method="sigkill")),
                                (AfterCheckpoint(4), chaos.hyperpod_reboot(rank=1, via="boto3",
                                                                           recover_timeout_s=120))])
    attach_evidence(outcome)
    outcome.assert_verdicts()
    _, rebooted = outcome.injections
    assert rebooted.evidence["boot_id_after"] != rebooted.evidence["boot_id_before"], rebooted.evidence

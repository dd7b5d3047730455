"""Kubernetes and HyperPod faults on a KubeRay RayCluster, through the Kubernetes API.

Without a profile these run on the embedded Kubernetes cluster (emulated API server,
kubelet, KubeRay-like reconciler, HyperPod-like agent and SageMaker endpoint; real Ray in
real test hosts), which the session starts for the ``kubernetes`` marker; with a profile,
on its cluster when it has a ``kubernetes`` section, else the fault factories skip saying why.  Every suite asserts the verdicts and attaches
the Kubernetes evidence (pods before/after, node, boot ids) the fault recorded.

Budgets, measured on Ray 2.60 (README, "Which budget a fault costs"): a hard pod delete,
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
from chaos.triggers import AfterCheckpoint

pytestmark = [pytest.mark.chaos, pytest.mark.kubernetes]


def attach_evidence(outcome):
    for inj in outcome.injections:
        allure.attach(json.dumps(inj.evidence, indent=1, default=str), name=f"kubernetes evidence: {inj.fault.kind}",
                      attachment_type=allure.attachment_type.JSON)


def assert_only_wrong_class(outcome):
    """Everything holds but the budget class: Ray charged max_failures for a preemption."""
    budget = outcome.verdict("within-budget")
    assert budget.status == "fail" and budget.diagnosis == "charged to the wrong budget class", budget.line()
    assert "'worker_group': 1" in budget.message, budget.message
    others = [v.line() for v in outcome.verdicts if v is not budget and v.fails()]
    assert not others, others


def test_hard_pod_delete_is_a_worker_failure(chaos):
    """``kubectl delete pod --grace-period=0 --force`` of rank 1's pod: the node dies at once,
    Train restarts on the spare node, KubeRay replaces the pod (a new name)."""
    outcome = chaos.run(chaos.workload(num_workers=2, max_failures=2, steps=20, checkpoint_every=5),
                        faults=[(AfterCheckpoint(2), chaos.pod_delete(rank=1))])
    attach_evidence(outcome)
    outcome.assert_verdicts()
    [inj] = outcome.injections
    deleted = inj.evidence["pod"].split("/", 1)[1]
    assert deleted in inj.evidence["pods_before"] and deleted not in inj.evidence["pods_after"], inj.evidence


def test_graceful_pod_delete_killed_inside_the_drain_window(chaos):
    """A graceful delete: Train hears the drain (PREEMPTING), the kubelet's SIGKILL comes
    before Ray's window ends, and Ray 2.60 charges max_failures (see the module docstring)."""
    outcome = chaos.run(
        chaos.workload(num_workers=2, max_failures=1, max_preemption_failures=2, steps=40, checkpoint_every=5),
        faults=[(AfterCheckpoint(2), chaos.pod_delete_graceful(rank=1))])
    attach_evidence(outcome)
    [inj] = outcome.injections
    assert inj.evidence["sigkill_inside_window"] is True, inj.evidence
    states = [e.data.get("cur") for e in outcome.timeline.of("state_changed")]
    assert "PREEMPTING" in states, f"Train never saw the drain notice: states {states}"
    assert_only_wrong_class(outcome)


def test_pod_eviction_killed_inside_the_drain_window(chaos):
    """An eviction of rank 1's pod through the Eviction API (what a drain does per pod):
    graceful, so as above — Train hears the drain, Ray 2.60 charges max_failures."""
    outcome = chaos.run(
        chaos.workload(num_workers=2, max_failures=1, max_preemption_failures=2, steps=40, checkpoint_every=5),
        faults=[(AfterCheckpoint(2), chaos.pod_evict(rank=1))])
    attach_evidence(outcome)
    [inj] = outcome.injections
    assert inj.evidence["eviction_attempts"] >= 1 and inj.evidence["sigkill_inside_window"] is True, inj.evidence
    states = [e.data.get("cur") for e in outcome.timeline.of("state_changed")]
    assert "PREEMPTING" in states, f"Train never saw the drain notice: states {states}"
    assert_only_wrong_class(outcome)


def test_node_drain_evicts_and_is_uncordoned_on_revert(chaos):
    """``kubectl drain`` of rank 1's node: cordoned, its Ray pod evicted (graceful, so as
    above), the replacement pod Pending until the revert uncordons the node."""
    outcome = chaos.run(
        chaos.workload(num_workers=2, max_failures=1, max_preemption_failures=2, steps=40, checkpoint_every=5),
        faults=[(AfterCheckpoint(2), chaos.node_drain(rank=1))])
    attach_evidence(outcome)
    assert_only_wrong_class(outcome)
    [inj] = outcome.injections
    node = chaos.env.backend.kube.node(inj.evidence["node"])
    assert not (node.get("spec") or {}).get("unschedulable"), f"{inj.evidence['node']} is still cordoned"


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


def test_hyperpod_replace_by_label(chaos):
    """The replacement label: the node object goes, a new node (new name) joins, Train
    resumes on the spare node meanwhile."""
    outcome = chaos.run(chaos.workload(num_workers=2, max_failures=2, steps=20, checkpoint_every=5),
                        faults=[(AfterCheckpoint(2), chaos.hyperpod_replace(rank=1, recover_timeout_s=120))])
    attach_evidence(outcome)
    outcome.assert_verdicts()
    [inj] = outcome.injections
    assert inj.evidence["new_node"] and inj.evidence["new_node"] != inj.evidence["node"], inj.evidence


@pytest.mark.extended
def test_hyperpod_reboot_through_boto3(chaos):
    """``batch_reboot_cluster_nodes`` through boto3 against the SageMaker API."""
    outcome = chaos.run(chaos.workload(num_workers=2, max_failures=2, steps=20, checkpoint_every=5),
                        faults=[(AfterCheckpoint(2), chaos.hyperpod_reboot(rank=1, via="boto3",
                                                                           recover_timeout_s=120))])
    attach_evidence(outcome)
    outcome.assert_verdicts()
    [inj] = outcome.injections
    assert inj.evidence["boot_id_after"] != inj.evidence["boot_id_before"], inj.evidence


@pytest.mark.extended
def test_raylet_kill_through_exec(chaos):
    """SIGKILL of rank 1's raylet by exec into its pod: ``ray start --block`` exits, the pod
    fails and KubeRay replaces it; Train restarts on the spare node."""
    if getattr(chaos.env.backend, "kube", None) is None:
        pytest.skip(f"needs the Kubernetes API: this session's backend is {chaos.env.backend.label}")
    outcome = chaos.run(chaos.workload(num_workers=2, max_failures=2, steps=20, checkpoint_every=5),
                        faults=[(AfterCheckpoint(2), RayletKill(rank=1, method="sigkill"))])
    outcome.assert_verdicts()

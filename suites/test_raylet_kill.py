"""Raylet kills: the node's Ray runtime dies; Train must restart and resume.

The expected charge (one worker-group failure per kill) and the SLOs follow from the
faults and the profile; the verdicts check resume-from-latest, the budget (count and
class), recovery time against the SLO, the run's end and healing.
"""

import pytest

from chaos.triggers import AfterCheckpoint

pytestmark = pytest.mark.chaos


@pytest.mark.extended
def test_raylet_kill_with_spare_capacity(chaos):
    """3 worker hosts, 2 ranks: the restart can use the spare host at once.  The reference
    workload as it comes (2 ranks, max_failures=3), or the user's own script as it is (the
    README's own-script line)."""
    outcome = chaos.run(
        chaos.workload(),
        faults=[(AfterCheckpoint(2), chaos.raylet_kill(rank=1))],
    )
    outcome.assert_verdicts()


@pytest.mark.extended
def test_raylet_kill_without_spare_capacity(chaos):
    """Every host runs a rank: training waits until node recovery brings the host back."""
    if chaos.embedded is not None and not chaos.embedded.config.node_recovery:
        pytest.skip("needs automatic node recovery (--chaos-node-recovery automatic)")
    workers = len(chaos.env.cluster.alive_workers())
    outcome = chaos.run(
        chaos.workload(num_workers=workers, max_failures=3, steps=20, checkpoint_every=5),
        faults=[(AfterCheckpoint(2), chaos.raylet_kill(rank=1))],
    )
    outcome.assert_verdicts()
    [killed] = outcome.injections
    back = [n for n in chaos.env.cluster.nodes() if n.alive and chaos.env.backend.same_host(killed.host, n)]
    assert back and back[0].node_id != killed.target.node_id, (
        f"{killed.target.describe()} should have rejoined with a new node id; alive there: {back}")


@pytest.mark.extended
def test_budget_exhaustion_ends_in_clean_failure(chaos):
    """max_failures=0: one kill must end the run ERRORED, charged to max_failures — not hang."""
    outcome = chaos.run(
        chaos.workload(num_workers=2, max_failures=0, steps=20, checkpoint_every=5),
        faults=[(AfterCheckpoint(1), chaos.raylet_kill(rank=1))],
        expect=chaos.expect(budget_exhausted=True),
    )
    outcome.assert_verdicts()
    budget = outcome.verdict("within-budget")
    assert budget.status == "expected", budget.message
    assert "retry budget exhausted: 1 failure charged to max_failures=0" in budget.message


@pytest.fixture
def slow_node_recovery(chaos):
    """The embedded cluster brings a dead node back only after 20 s (restored after the test)."""
    cluster = chaos.embedded
    if cluster is None or not cluster.config.node_recovery:
        pytest.skip("needs the embedded cluster with automatic node recovery")
    before, cluster.config.recovery_delay_s = cluster.config.recovery_delay_s, 20.0
    yield cluster.config.recovery_delay_s
    cluster.config.recovery_delay_s = before


def test_replacement_slower_than_the_worker_group_start_timeout(chaos, slow_node_recovery):
    """No spare capacity and the node comes back after the worker group's start timeout (8 s
    here, 60 s by default): measured on Ray 2.60, each timed-out start is a ControllerError
    (WorkerGroupStartupTimeoutError) charged to controller_failure_limit (unlimited by
    default) and retried; the kill itself is the one charge to max_failures.  The verdict
    attributes those restarts to the fault that took the capacity, not to the run."""
    workers = len(chaos.env.cluster.alive_workers())
    spec = chaos.workload(num_workers=workers, max_failures=3, steps=20, checkpoint_every=5)
    spec.env_vars["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = "8"
    outcome = chaos.run(spec, faults=[(AfterCheckpoint(2), chaos.raylet_kill(rank=1))])
    outcome.assert_verdicts()
    waits = outcome.verdict("within-budget").evidence["capacity_waits"]
    assert waits and {w["budget_class"] for w in waits} == {"controller"}, waits
    assert all("WorkerGroupStartupTimeoutError" in w["error_types"] for w in waits), waits
    # A start that timed out never had a worker group, so it is no attempt of its own: the
    # attempt that recovered is the first one after the kill, once the node was back.
    recovery = outcome.verdict("recovery-time").evidence
    assert recovery["recovered_attempt"] == 1 and recovery["time_to_restart"] > slow_node_recovery, recovery

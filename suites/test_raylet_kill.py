"""Raylet kills: the node's Ray runtime dies; Train must restart and resume.

Each test states the expected budget charge; the verdicts check resume-from-latest,
the budget (count and class), recovery time against the SLO, the run's end and healing.
"""

import pytest

from chaos.triggers import AfterCheckpoint

pytestmark = pytest.mark.chaos


def test_raylet_kill_with_spare_capacity(chaos):
    """3 worker hosts, 2 ranks: the restart can use the spare host at once."""
    outcome = chaos.run(
        chaos.workload(num_workers=2, max_failures=3, steps=30, checkpoint_every=5),
        faults=[(AfterCheckpoint(2), chaos.raylet_kill(rank=1))],
        expect=chaos.expect(charged={"worker_group": 1}),
    )
    outcome.assert_verdicts()


def test_raylet_kill_without_spare_capacity(chaos):
    """Every host runs a rank: training waits until node recovery brings the host back."""
    if chaos.embedded is not None and not chaos.embedded.config.node_recovery:
        pytest.skip("needs automatic node recovery (--chaos-node-recovery automatic)")
    workers = len(chaos.env.cluster.alive_workers())
    outcome = chaos.run(
        chaos.workload(num_workers=workers, max_failures=3, steps=30, checkpoint_every=5),
        faults=[(AfterCheckpoint(2), chaos.raylet_kill(rank=1))],
        expect=chaos.expect(charged={"worker_group": 1}),
    )
    outcome.assert_verdicts()
    target = outcome.targets[0]
    back = [n for n in chaos.env.cluster.nodes() if n.ip == target.node_ip and n.alive]
    assert back and back[0].node_id != target.node_id, (
        f"{target.node_ip} should have rejoined with a new node id; alive there: {back}")


def test_two_raylet_kills_in_one_run(chaos):
    """Two kills, each after a fresh checkpoint: two charges, two correct resumes."""
    outcome = chaos.run(
        chaos.workload(num_workers=2, max_failures=3, steps=40, checkpoint_every=5),
        faults=[(AfterCheckpoint(2), chaos.raylet_kill(rank=1)),
                (AfterCheckpoint(4), chaos.raylet_kill(rank=0))],
        expect=chaos.expect(charged={"worker_group": 2}),
    )
    outcome.assert_verdicts()


def test_budget_exhaustion_ends_in_clean_failure(chaos):
    """max_failures=0: one kill must end the run ERRORED, charged to max_failures — not hang."""
    outcome = chaos.run(
        chaos.workload(num_workers=2, max_failures=0, steps=30, checkpoint_every=5),
        faults=[(AfterCheckpoint(1), chaos.raylet_kill(rank=1))],
        expect=chaos.expect(charged={"worker_group": 1}, budget_exhausted=True),
    )
    outcome.assert_verdicts()
    budget = outcome.verdict("within-budget")
    assert budget.status == "expected", budget.message
    assert "retry budget exhausted: 1 failure charged to max_failures=0" in budget.message

"""Correlated failures: one fault on several ranks' nodes in the same instant (a rack or a
power domain lost), fanned out in parallel with each host's result in the ledger.

What Ray charges for k nodes lost at once is measured here and asserted: Ray 2.60 charges
one failure to ``max_failures``, not k (the controller's one poll sees every dead rank and
raises one WorkerGroupError), which is what a correlated fault's expectation defaults to.
"""

import pytest

from chaos.timeline import recovery_metrics
from chaos.triggers import AfterCheckpoint

pytestmark = pytest.mark.chaos


def test_losing_more_nodes_than_the_spare_capacity_at_once(chaos):
    """2 ranks on 3 worker hosts, both ranks' raylets killed in one instant: one host is
    spare, two are needed, so training waits until node recovery brings a host back."""
    if chaos.embedded is not None and not chaos.embedded.config.node_recovery:
        pytest.skip("needs automatic node recovery (--chaos-node-recovery automatic)")
    outcome = chaos.run(
        chaos.workload(num_workers=2, max_failures=3, steps=20, checkpoint_every=5),
        faults=[(AfterCheckpoint(2), chaos.correlated(chaos.raylet_kill, ranks=[0, 1]))],
    )
    outcome.assert_verdicts()

    # The measured charge: one worker-group failure for both nodes, Ray's own count.
    decisions = [d.data for d in outcome.timeline.of("failure_decision") if d.data["budget_class"] == "worker_group"]
    assert [(d["decision"], d["count"]) for d in decisions] == [("RETRY", 1)], decisions
    assert outcome.verdict("within-budget").evidence["charged_by_faults"] == {"worker_group": 1}

    # One recovery for the group, detected once both nodes were DEAD.
    [recovery] = recovery_metrics(outcome.timeline)
    assert recovery.members == 2 and recovery.recovered_attempt is not None, recovery

    # One ledger entry per host, each with its own result, all in one group.
    injs = outcome.injections
    entries = chaos.env.ledger.entries()
    assert len(injs) == 2 and len({i.target.node_id for i in injs}) == 2, [i.target for i in injs]
    mine = [entries[i.ledger_id] for i in injs]
    assert len({e["group"] for e in mine}) == 1, mine
    for inj, entry in zip(injs, mine):
        result = entry["result"]
        assert result["ok"] and result["took_s"] is not None and result["node_id"] == inj.target.node_id, entry
        assert entry["state"] in ("reverted", "nothing-to-revert"), entry
    injected = outcome.timeline.of("fault_injected")
    assert {e.data["ledger_id"] for e in injected} == {i.ledger_id for i in injs}

    # Both hosts came back as new nodes.
    for killed in injs:
        back = [n for n in chaos.env.cluster.nodes() if n.alive and chaos.env.backend.same_host(killed.host, n)]
        assert back and back[0].node_id != killed.target.node_id, (
            f"{killed.target.describe()} should have rejoined with a new node id; alive there: {back}")

"""Final-state equivalence: a faulted run must end in the same state as a fault-free run
of the same workload and seed.

The resume verdicts see the step a restart resumed at; this one sees whether the weights
and optimizer came back too: a restore that set the step but not the state ends in another
final digest.  The fault-free baseline runs first (or comes from the cache under
<reports>/baselines; --chaos-refresh-baselines makes it anew).
"""

import pytest

from chaos.triggers import AfterCheckpoint

pytestmark = pytest.mark.chaos


@pytest.mark.extended
def test_two_raylet_kills_end_in_the_fault_free_final_state(chaos):
    """2 ranks on 3 hosts, two kills, each after a fresh checkpoint: two charges, two correct
    resumes, and every rank's final step and state (the reference workload's state_digest of
    its weights and optimizer, and its loss) equal the fault-free baseline's."""
    outcome = chaos.run(
        chaos.workload(num_workers=2, max_failures=3, steps=30, checkpoint_every=5),
        faults=[(AfterCheckpoint(2), chaos.raylet_kill(rank=1)),
                (AfterCheckpoint(4), chaos.raylet_kill(rank=0))],
        expect=chaos.expect(final_state=True),
    )
    outcome.assert_verdicts()
    verdict = outcome.verdict("final-state")
    assert verdict.status == "pass", verdict.line()

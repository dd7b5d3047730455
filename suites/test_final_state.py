"""Final-state equivalence and the state trajectory: a faulted run must follow, step by
step, and end in the same state as a fault-free run of the same workload and seed.

The resume verdicts see the step a restart resumed at; these see whether the weights,
optimizer, LR scheduler, RNG and data position came back too: a restore that set the step
but not the state leaves the fault-free trajectory (named by the reference workload's
per-part digests) and ends in another final digest.  The fault-free baseline runs first
(or comes from the cache under <reports>/baselines; --chaos-refresh-baselines makes it anew).
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


@pytest.mark.extended
def test_a_restore_that_loses_the_optimizer_leaves_the_fault_free_trajectory(chaos):
    """The buggy twin of the test above: the reference workload restores its checkpoint but
    its optimizer (momentum) starts fresh.  The step came back (resumed-from-latest passes);
    the trajectory fails at the first step after the checkpoint, naming the optimizer, and the
    final state differs.  Shares the baseline above (a restore-only option is not in its key)."""
    outcome = chaos.run(
        chaos.workload(num_workers=2, max_failures=3, steps=30, checkpoint_every=5, forget=("optimizer",)),
        faults=[(AfterCheckpoint(2), chaos.raylet_kill(rank=1))],
        expect=chaos.expect(final_state=True, baseline=True),
    )
    resume = outcome.verdict("resumed-from-latest")
    assert resume.status == "pass", resume.line()
    trajectory = outcome.verdict("state-trajectory")
    assert trajectory.status == "fail" and trajectory.diagnosis == "state not restored", trajectory.line()
    assert trajectory.message.startswith("state not restored: step 11 (attempt 1, rank 0) left the fault-free "
                                         "trajectory: digest_optimizer "), trajectory.line()
    assert "the optimizer's state (momentum, ...) was not restored" in trajectory.message
    final = outcome.verdict("final-state")
    assert final.status == "fail" and final.diagnosis == "final state differs", final.line()

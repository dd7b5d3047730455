"""The contract tier: real runs' recorder tapes (tests/contract/fixtures, recorded by make
integration from real script shapes on real Ray) replayed through the recorder's logic and
the verdicts, without a cluster.

The diagnoses below are written by hand from what each script does — never copied from the
verdicts' output — so a verdict rule that stops firing, or a recorder that reads Ray's
facts differently, fails here in seconds instead of in a 2-minute session.
"""

import re

import pytest

import tapes
from chaos.verdicts import judge

RESUMED = "right after the latest checkpoint"


def one_stride_after_the_checkpoint(stride):
    """A message check: 'attempt 1 resumed at step ck+stride, right after … (step ck) on every rank'."""
    def check(message):
        m = re.search(rf"attempt 1 resumed at step (\d+), {RESUMED} \(step (\d+)\) on every rank", message)
        return m is not None and int(m[1]) == int(m[2]) + stride
    check.__name__ = f"resumed one stride ({stride}) after the latest checkpoint"
    return check


def grown_back_right_after_the_checkpoint(attempt, ranks):
    """A message check: 'attempt k resumed at step ck+1, right after … (step ck) on every rank (n)'."""
    def check(message):
        m = re.search(rf"attempt {attempt} resumed at step (\d+), {RESUMED} \(step (\d+)\) on every rank \({ranks}\)",
                      message)
        return m is not None and int(m[1]) == int(m[2]) + 1
    check.__name__ = f"attempt {attempt} resumed right after the latest checkpoint on all {ranks} ranks"
    return check


def one_stride_too_far(stride):
    """A message check: 'resumed past the checkpoint: attempt 1 began at step ck+2*stride …
    although checkpoint step ck', steps ck+stride..ck+2*stride skipped."""
    def check(message):
        m = re.search(r"resumed past the checkpoint: attempt 1 began at step (\d+) on every rank "
                      r"although checkpoint step (\d+) .*\(steps (\d+)\.\.(\d+) were skipped\)", message)
        return m is not None and int(m[1]) == int(m[2]) + 2 * stride and \
            (int(m[3]), int(m[4])) == (int(m[2]) + stride, int(m[1]))
    check.__name__ = f"resumed one stride ({stride}) past the step after the latest checkpoint"
    return check


def one_stride_unpredicted(message):
    """A message check: unverifiable because the first step falls between the checkpoint and
    the step a stride predicts, or because the strides vary."""
    return "between checkpoint step" in message or "varying strides" in message


# fixture -> {verdict name prefix: (status, phrase its message must contain, a check of it, or None)}.
# Any verdict not listed must not fail and must not be unverifiable.
EXPECTED = {
    # examples/workloads/user_train.py: steps 1..25 on 2 ranks, a checkpoint every 5th; its
    # node killed after checkpoint 2 (step 10); FailureConfig(max_failures=3)
    "user_healthy": {
        "resumed-from-latest": ("pass", f"attempt 1 resumed at step 11, {RESUMED} (step 10) on every rank"),
        "within-budget": ("pass", "charged 1 to max_failures=3"),
        "run-finished": ("pass", "FINISHED"),
    },
    "user_ignores_checkpoint": {  # never calls get_checkpoint()
        "resumed-from-latest": ("fail", "restarted from scratch: attempt 1 began at step 1 on every rank although "
                                        "checkpoint step 10"),
    },
    "user_restores_rank0_only": {  # rank 1 starts over; the run then hangs in a collective (stopped)
        "resumed-from-latest": ("fail", "restarted from scratch: rank 1 began attempt 1 at step 1"),
    },
    "user_default_failure_config": {  # FailureConfig left at max_failures=0
        "within-budget": ("fail", "retry budget exhausted: 1 failure charged to max_failures=0"),
        "recovery-time": ("fail", "recovery too slow: training never resumed after the fault"),
        "run-finished": ("fail", None),
    },
    "user_unknown_step_metric": {  # counts steps as samples_seen, which auto does not know
        "resumed-from-latest": ("unverifiable", "no step metric 'step', 'global_step'"),
    },
    "user_named_step_metric": {  # the same, named with --chaos-step-metric samples_seen
        "resumed-from-latest": ("pass", f"attempt 1 resumed at step 11, {RESUMED} (step 10)"),
    },
    "user_restores_previous_checkpoint": {  # scans its storage, loads step 5 instead of 10
        "resumed-from-latest": ("fail", "resumed from an older checkpoint"),
    },
    "user_crashes_on_restore": {  # every restart raises loading its checkpoint; max_failures=1:
        # the crash, not the fault, is what failed attempt 1 (and then exhausted the budget)
        "within-budget": ("fail", "unrelated failure: attempt 1 failed with"),
        "recovery-time": ("fail", "recovery too slow: training never resumed after the fault"),
        "run-finished": ("fail", None),
    },
    "user_retrains_checkpoint_step": {  # range(step, N) after restoring: step 10 trained and committed again
        "resumed-from-latest": ("fail", "resumed from an older checkpoint: attempt 1 began at step 10 on every rank"),
    },
    "user_epoch_local_step": {  # reports the step within its 5-step epoch: 0..4, 0..4, ...
        "resumed-from-latest": ("unverifiable", "step metric 'step' goes back: rank 0 reported step 4, then 0 in "
                                                "attempt 0"),
    },
    "user_no_step_after_restore": {  # the restored attempt reports its loss without the step
        "resumed-from-latest": ("unverifiable", "without the step metric 'step' (it reported 'loss')"),
    },
    # tests/integration/resume_shapes.py: user_train.py with a flag and the faults a shape needs
    "user_fault_before_checkpoints_then_evaluates": {  # --evaluate-after-restore; killed at step 1, then 11
        "resumed-from-latest (attempt 1)": ("pass", "no checkpoint existed yet: attempt 1 correctly started from "
                                                    "step 1 on every rank"),
        "resumed-from-latest (attempt 2)": ("pass", "attempt 2 resumed at step 10, at the latest checkpoint's own "
                                                    "step (10), evaluating after loading it"),
        "state-restored": ("pass", None),
        "within-budget": ("pass", "charged 2 to max_failures=3"),
        "run-finished": ("pass", "FINISHED"),
    },
    "user_restores_step_only": {  # --evaluate-after-restore --restore-step-only: weights and optimizer lost
        "resumed-from-latest": ("fail", "state not restored: attempt 1 began at step 10 on every rank"),
        "state-restored": ("fail", "state not restored"),
    },
    "user_initial_checkpoint_without_step": {  # commits its initial weights before step 1, without a step
        "resumed-from-latest": ("unverifiable", "the latest checkpoint's report carried no step for rank 0"),
    },
    "user_reports_at_checkpoints_only": {  # reports 5, 10, ...: killed after the first, no stride yet; again after the third
        "resumed-from-latest (attempt 1)": ("unverifiable", "no report followed checkpoint step 5"),
        "resumed-from-latest (attempt 2)": ("pass", "resumed at step 20, right after the latest checkpoint (step 15)"),
    },
    "user_doubled_stride_after_restore": {  # reports 5, 10; restored at 10, goes on at 16 reporting every 10th
        "resumed-from-latest": ("fail", "resumed past the checkpoint: attempt 1 began at step 20"),
    },
    "user_crash_on_preemption_notice": {  # rank 1's node drained; rank 0 (elsewhere) raises in its notice handler
        "within-budget": ("fail", "unrelated failure: attempt 0 failed with ValueError"),
    },
    "user_relaxed_survivors_commit": {  # 3 ranks, rank 1's node drained; ranks 0 and 2 commit without it
        "resumed-from-latest": ("pass", "resumed at step"),
        "within-budget": ("pass", "charged 1 to max_preemption_failures"),
    },
    "user_retrains_first_checkpoint_step": {  # range(step, N), killed after checkpoint 1
        "resumed-from-latest": ("fail", "restarted from scratch: attempt 1 began at step 5 on every rank"),
    },
    "user_no_checkpoint": {  # never hands Train a checkpoint
        "resumed-from-latest": ("unverifiable", "the run reported no checkpoint to Ray Train"),
    },
    # --warmup-fit: a fault-free fit() of 3 steps first, then the run under test (killed after
    # its checkpoint 2, step 10): every verdict judges the second run
    "user_warmup_fit_healthy": {
        "resumed-from-latest (run 2, attempt 1)": ("pass", f"attempt 1 resumed at step 11, {RESUMED} (step 10) on "
                                                           "every rank"),
        "within-budget": ("pass", "charged 1 to max_failures=3"),
        "run-finished": ("pass", "FINISHED"),
    },
    "user_warmup_fit_ignores_checkpoint": {  # the run under test never calls get_checkpoint()
        "resumed-from-latest (run 2, attempt 1)": ("fail", "restarted from scratch: attempt 1 began at step 1 on "
                                                           "every rank although checkpoint step 10"),
    },
    # user_train.py with the reporting orders of tests/integration/resume_shapes.py's reporting-orders
    # group, killed at step 12 (checkpoint 10 the latest): each needs the restart's first state value
    "user_checkpoint_before_metrics": {  # each save: report({}, checkpoint), then the step's metrics
        "resumed-from-latest": ("pass", "attempt 1 resumed at step 11"),
        "state-restored": ("pass", None),
    },
    "user_saved_at_top": {  # saves the state before step 10 as 10; the restart begins at 10 and saves it again
        "resumed-from-latest": ("pass", "attempt 1 resumed at step 10"),
        "state-restored": ("pass", None),
    },
    "user_saved_at_top_skips_the_step": {  # the same, its restart beginning at 11: step 10's batch never trained
        "resumed-from-latest": ("fail", "resumed past the checkpoint: attempt 1 began at step 11 on every rank"),
        "state-restored": ("fail", "state not restored"),
    },
    # Hugging Face Trainer with Ray's callback: reports (with a checkpoint) at steps 4, 8, ...
    "hf_trainer_healthy": {  # one report (4 steps) after the latest checkpoint: 12 after 8 as recorded
        "resumed-from-latest": ("pass", one_stride_after_the_checkpoint(4)),
        "within-budget": ("pass", "charged 1 to max_failures"),
        "run-finished": ("pass", "FINISHED"),
    },
    "hf_trainer_ignores_checkpoint": {
        "resumed-from-latest": ("fail", "restarted from scratch: attempt 1 began at step 4 on every rank"),
    },
    "hf_trainer_misaligned_logging": {  # logging_steps=10, save_steps=25: reports 20, 50, 70, 100, killed after
        # checkpoint 2 (50): the right restart first reports 70, which no stride predicts — never a failure
        "resumed-from-latest": ("unverifiable", one_stride_unpredicted),
        "state-restored": ("n/a", None),
    },
    # Lightning with RayDDPStrategy and Ray's callback: step 4, 8, ... at each epoch's end
    "lightning_healthy": {  # likewise: 12 after 8 as recorded
        "resumed-from-latest": ("pass", one_stride_after_the_checkpoint(4)),
        "run-finished": ("pass", "FINISHED"),
    },
    # gradient accumulation x4: global_step 4, 8, ... reported, a checkpoint every 12
    "grad_accum_healthy": {  # the fault lands after checkpoint 24 or 36 (both recorded): the rule
        "resumed-from-latest": ("pass", one_stride_after_the_checkpoint(4)),
        "run-finished": ("pass", "FINISHED"),
    },
    "grad_accum_resumes_past_checkpoint": {  # restores global_step one window too far: after
        # checkpoint 24 (36 in another recording) the restart that should go on at 28 (24 + the
        # stride of 4) goes on at 32, steps 28..32 skipped
        "resumed-from-latest": ("fail", one_stride_too_far(4)),
    },
    # reports every 3rd step, checkpoints every 6th: the restart reports one stride (3) after
    # the latest checkpoint — 12, or 18 when the killed node's workers committed it before
    # Ray saw the node die (both recorded), so the rule is written, not the step
    "every_third_healthy": {
        "resumed-from-latest": ("pass", one_stride_after_the_checkpoint(3)),
        "run-finished": ("pass", "FINISHED"),
    },
    # suites/test_elastic.py: the reference workload elastic, (2, 3) ranks on 3 hosts; rank 1's
    # node lost after checkpoint 2 (step 10): attempt 1 goes on with 2 ranks from it; the host
    # back, Train resizes (no failure decision) and attempt 2's 3 ranks — rank 2 too, absent when
    # the checkpoint was committed — resume right after the latest one, from the state it saved
    "elastic_shrinks_and_grows_back": {
        "resumed-from-latest (attempt 1)": ("pass", f"attempt 1 resumed at step 11, {RESUMED} (step 10) on every rank "
                                                    "(2)"),
        "resumed-from-latest (attempt 2)": ("pass", grown_back_right_after_the_checkpoint(2, 3)),
        "state-restored (attempt 1)": ("pass", "step 11 began from the state checkpoint step 10 saved"),
        "state-restored (attempt 2)": ("pass", "attempt 1 ran 2 ranks, attempt 2 3"),
        "within-budget": ("pass", "charged 1 to max_failures=3"),
        "run-finished": ("pass", "FINISHED"),
    },
}


def test_every_fixture_has_a_hand_written_diagnosis_and_every_diagnosis_a_fixture():
    assert sorted(EXPECTED) == tapes.names(), (
        "tests/contract/fixtures and EXPECTED disagree: record the missing fixtures with make integration, "
        "or write the diagnosis of a new one here")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_is_current(name):
    stale = tapes.Fixture(name).stale()
    assert stale is None, stale


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_replayed_verdicts(name):
    fixture = tapes.Fixture(name)
    verdicts = judge(fixture.timeline(), fixture.expectation(), finished=fixture.finished)
    lines = "\n".join(v.line() for v in verdicts)
    for prefix, (status, phrase) in EXPECTED[name].items():
        matching = [v for v in verdicts if v.name.startswith(prefix)]
        assert matching, f"{name}: no {prefix} verdict in\n{lines}"
        for v in matching:
            assert v.status == status, f"{name}: {v.name} is {v.status}, expected {status}\n{lines}"
            if callable(phrase):
                assert phrase(v.message), f"{name}: {v.message!r} is not {phrase.__name__}"
            else:
                assert phrase is None or phrase in v.message, f"{name}: {phrase!r} not in {v.message!r}"
    unexpected = [v for v in verdicts if v.status in ("fail", "unverifiable")
                  and not any(v.name.startswith(p) for p in EXPECTED[name])]
    assert not unexpected, f"{name}: verdicts that should have passed:\n" + "\n".join(v.line() for v in unexpected)

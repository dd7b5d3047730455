"""resumed-from-latest: where every rank of every restart began, against the latest committed
checkpoint, on recorded timelines (issue 44's reporting shapes: test_verdict_shapes.py)."""

import dataclasses

import pytest

from chaos.errors import VerificationError
from chaos.verdicts import Baseline, Diagnosis, Expect, check
from chaos.verdicts.resume import resumed_from_latest
from timelines import Recorded, Script, evaluated_or_retrained, train_loss

DET = Expect(deterministic=True)


def test_restart_from_scratch_is_diagnosed():
    tl = Script().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(1, 20).finish().timeline()
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "fail" and v.diagnosis == "restarted from scratch"
    assert v.message.startswith("restarted from scratch")
    assert v.evidence["latest_checkpoint"] == "/storage/checkpoint_10"


def test_resume_from_older_checkpoint_is_diagnosed():
    tl = Script().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(6, 20).finish().timeline()
    [v] = resumed_from_latest(tl, DET)
    assert v.diagnosis == "resumed from an older checkpoint"
    assert v.message.startswith("resumed from an older checkpoint: attempt 1 began at step 6 on every rank although checkpoint "
                                "step 10 was committed")
    assert "that follows checkpoint step 5" in v.message


def test_resume_past_the_checkpoint_is_diagnosed_as_skipped_data():
    tl = Script().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(14, 20).finish().timeline()
    [v] = resumed_from_latest(tl, DET)
    assert v.diagnosis == "resumed past the checkpoint"
    assert "steps 11..14 were skipped" in v.message


def test_a_resume_from_a_checkpoint_ray_never_committed_is_named():
    # Rank 0 wrote step 15's checkpoint to storage; the fault came before rank 1 reported step 15,
    # so Ray's latest committed checkpoint is step 10.  A script that scans storage loads 15.
    s = Script().start_attempt().steps(1, 14).persist("/storage/checkpoint_15", 15).fault().decision()
    tl = s.start_attempt().steps(16, 20).finish().timeline()
    [v] = resumed_from_latest(tl, DET)
    assert v.diagnosis == "resumed past the checkpoint", v.line()
    assert ("steps 11..16 were skipped: it follows step 15, whose checkpoint rank 0 had written to storage in attempt "
            "0 (/storage/checkpoint_15) but Ray never committed") in v.message
    # the twin: the same skip with no uncommitted checkpoint behind it says only what was skipped
    tl = Script().start_attempt().steps(1, 14).fault().decision().start_attempt().steps(16, 20).finish().timeline()
    [v] = resumed_from_latest(tl, DET)
    assert v.diagnosis == "resumed past the checkpoint" and "never committed" not in v.message, v.line()


def test_fault_before_any_checkpoint_expects_a_fresh_start():
    tl = Script().start_attempt().steps(1, 3).fault().decision().start_attempt().steps(1, 10).finish().timeline()
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "pass" and v.diagnosis is None and v.message.startswith("no checkpoint existed yet"), v.line()
    tl = Script().start_attempt().steps(1, 3).fault().decision().start_attempt().steps(3, 10).finish().timeline()
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "fail" and v.diagnosis == "resumed at an unexpected step"


def test_no_step_metric_is_unverifiable_not_guessed():
    s = Script(step_metric="epoch").start_attempt().steps(1, 12, metric=False).fault().decision()
    tl = s.start_attempt().steps(1, 5, metric=False).finish().timeline()
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "unverifiable"
    assert v.message.startswith("unverifiable: no step metric 'epoch'")
    with pytest.raises(VerificationError, match="unverifiable: no step metric"):
        check([v])  # unverifiable is not a pass: by default it fails the test
    check([v], unverifiable="warn")


def test_two_restarts_give_two_resume_verdicts():
    s = (Script().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(11, 22)
         .fault("n0").decision().start_attempt().steps(21, 30).finish())
    verdicts = resumed_from_latest(s.timeline(), DET)
    assert [v.status for v in verdicts] == ["pass", "pass"]
    assert [v.evidence["latest_checkpoint_step"] for v in verdicts] == [10, 20]


# -- the resume rule from the run's own report sequence -----------------------------------
def test_reporting_every_third_step_resumes_at_the_step_that_followed_the_checkpoint():
    tl = (Script().start_attempt().steps(3, 15, every=6, stride=3).fault().decision()
          .start_attempt().steps(15, 30, every=6, stride=3).finish().timeline())
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "pass", v.line()
    assert "resumed at step 15, right after the latest checkpoint (step 12)" in v.message
    assert "the step that followed checkpoint step 12" in v.evidence["rule"]


def test_every_report_a_checkpoint_uses_the_reporting_stride():
    # Ray's Hugging Face / Lightning callbacks report only when a checkpoint is saved.
    tl = (Script().start_attempt().steps(5, 15, every=5, stride=5).fault().decision()
          .start_attempt().steps(20, 30, every=5, stride=5).finish().timeline())
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "pass", v.line()
    assert "reporting stride 5" in v.evidence["rule"]


def test_first_report_at_the_checkpoint_step_passes_when_the_next_trained_step_reproduces():
    # evaluate after load: step 11 (trained after it) gives what attempt 0 gave for step 11
    [v] = resumed_from_latest(evaluated_or_retrained(12, 11), DET)
    assert v.status == "pass", v.line()
    assert "at the latest checkpoint's own step (10), evaluating after loading it" in v.message
    assert "step 11 reproduced" in v.evidence["rule"]


def test_a_retrained_checkpoint_step_fails_by_the_next_step_value_or_the_second_commit():
    # range(ck, N): step 10 trained again, so step 11 does not reproduce attempt 0's value
    [v] = resumed_from_latest(evaluated_or_retrained(12, 11, every_after=None, state_after=lambda r, s: train_loss(r, s) * 1.1), DET)
    assert v.status == "fail" and v.diagnosis == "state not restored", v.line()
    assert "step 11 gave" in v.message and "step 10 was trained again, or the state was not restored" in v.message
    # the re-trained step commits its checkpoint again: work done twice, whatever the values
    tl = (Script().start_attempt().steps(1, 12, state=train_loss).fault().decision().start_attempt()
          .steps(10, 20, state=train_loss).finish().timeline())
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "fail" and v.diagnosis == "resumed from an older checkpoint", v.line()
    assert "steps 10..10 were trained again: step 10 had been committed before" in v.message


def periodic_and_just_in_time(first_value_after):
    """Checkpoints at step 4 (periodic) and 5 (just in time: no second commit of 5 later), step
    6, the fault; the restart first reports step 5 with ``first_value_after`` for its loss, then
    trains 6..12 reproducing attempt 0's values (every 8th step a checkpoint)."""
    s = Script(state_metric="loss").start_attempt()
    for st in range(1, 7):
        s.report({0: st, 1: st}, f"/storage/ck{st}" if st in (4, 5) else None,
                 states={r: train_loss(r, st) for r in (0, 1)})
    s.fault().decision().start_attempt()
    s.report({0: 5, 1: 5}, states={r: first_value_after(r) for r in (0, 1)})
    for st in range(6, 13):
        s.report({0: st, 1: st}, "/storage/ck8" if st == 8 else None, states={r: train_loss(r, st) for r in (0, 1)})
    return s.finish().timeline()


def test_a_checkpoint_step_trained_again_from_an_older_checkpoint_fails_though_nothing_is_committed_twice():
    # loaded checkpoint 4, trained step 5 again: its value is step 5's from before it was
    # trained (attempt 0), which neither an evaluation after loading 5 nor 5 trained from 5 gives
    [v] = resumed_from_latest(periodic_and_just_in_time(lambda r: train_loss(r, 5)), DET)
    assert v.status == "fail" and v.diagnosis == "resumed from an older checkpoint", v.line()
    assert "it was trained again from an older state (checkpoint step 4)" in v.message, v.line()
    # twin: an evaluation after loading checkpoint 5 gives another value, and step 6 decides
    [v] = resumed_from_latest(periodic_and_just_in_time(lambda r: 99.0 + r), DET)
    assert v.status == "pass" and "step 6 reproduced" in v.evidence["rule"], v.line()


def test_a_first_checkpoint_step_trained_again_without_its_state_is_a_restart_from_scratch():
    # one checkpoint (5) only: its step's earlier value again means the state of no checkpoint
    s = Script(state_metric="loss").start_attempt()
    for st in range(1, 7):
        s.report({0: st, 1: st}, "/storage/ck5" if st == 5 else None, states={r: train_loss(r, st) for r in (0, 1)})
    s.fault().decision().start_attempt()
    s.report({0: 5, 1: 5}, states={r: train_loss(r, 5) for r in (0, 1)})
    s.report({0: 6, 1: 6}, states={r: train_loss(r, 6) for r in (0, 1)})
    [v] = resumed_from_latest(s.finish().timeline(), DET)
    assert v.status == "fail" and v.diagnosis == "restarted from scratch", v.line()
    assert "trained again without the checkpoint's state" in v.message, v.line()


def test_a_state_metric_that_does_not_move_with_training_decides_no_checkpoint_step_first_report():
    # loss 1.0 at every step: step 5's value again says nothing about the state it came from,
    # and step 6 reproducing says nothing either — step 5 trained again (one update more)
    # gives the same 1.0: unverifiable, never a pass on a value that cannot tell
    s = Script(state_metric="loss").start_attempt()
    for st in range(1, 7):
        s.report({0: st, 1: st}, f"/storage/ck{st}" if st in (4, 5) else None, states={0: 1.0, 1: 1.0})
    s.fault().decision().start_attempt()
    for st in range(5, 9):
        s.report({0: st, 1: st}, states={0: 1.0, 1: 1.0})
    [v] = resumed_from_latest(s.finish().timeline(), DET)
    assert v.status == "unverifiable" and v.diagnosis is Diagnosis.STATE_DOES_NOT_TELL, v.line()
    assert "step 6 reproduced 1 of attempt 0, but step 5 gave 1 in attempt 0" in v.message, v.line()
    # twin: a loss that moves with training, step 6 reproducing decides (an evaluation after loading 5)
    [v] = resumed_from_latest(periodic_and_just_in_time(lambda r: 99.0 + r), DET)
    assert v.status == "pass" and "step 6 reproduced" in v.evidence["rule"], v.line()


def test_a_rank_without_a_step_in_the_first_report_round_is_judged_by_its_own_first_step():
    def restart(rank1_steps):
        s = Script().start_attempt().steps(1, 12).fault().decision().start_attempt()
        s.report({0: 11, 1: None})
        for st, r1 in zip(range(12, 20), rank1_steps):
            s.report({0: st, 1: r1})
        return s.finish().timeline()

    # rank 1 then counts from 2: whatever its stepless first report was, it did steps before
    # checkpoint 10 again (it used to be left out of the verdict, which passed on rank 0)
    [v] = resumed_from_latest(restart(range(2, 10)), DET)
    assert v.status == "fail" and "rank 1 began attempt 1 at step 2" in v.message, v.line()
    assert "its first step, 2, is before checkpoint step 10" in v.message and sorted(v.evidence["ranks"]) == [0, 1]
    # twin: rank 1 then reports 12 — right if its first report was 11, but nothing says so
    [v] = resumed_from_latest(restart(range(12, 20)), DET)
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no step after the restart", v.line()
    assert "rank 1's first report(s) in attempt 1 carried no step: its first step, 12" in v.message, v.line()
    # never a step from rank 1 in the attempt: unverifiable too, never a pass on rank 0 alone
    [v] = resumed_from_latest(restart([None] * 8), DET)
    assert v.status == "unverifiable" and "nor did any later one" in v.message, v.line()
    # the healthy twin: every rank's step in the first round
    tl = Script().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(11, 20).finish().timeline()
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "pass" and sorted(v.evidence["ranks"]) == [0, 1], v.line()


def test_an_attempt_whose_start_event_is_missing_is_still_judged_by_its_reports():
    # the recorder's attempt_started of attempt 1 is gone: its reports still make a verdict
    s = Script().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(1, 20)
    tl = s.finish().timeline()
    tl.events[:] = [e for e in tl.events if not (e.kind == "attempt_started" and e.attempt == 1)]
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "fail" and v.diagnosis == "restarted from scratch", v.line()


def test_a_first_report_at_the_checkpoint_step_then_a_skipped_step_fails_as_resumed_past_it():
    # an evaluation at 10, then step 12: step 11 was skipped, though 12 reproduces attempt 0's
    [v] = resumed_from_latest(evaluated_or_retrained(14, 12), DET)
    assert v.status == "fail" and v.diagnosis == "resumed past the checkpoint", v.line()
    assert "reported step 10, then step 12: steps 11..12 were skipped" in v.message, v.line()
    # twin: an evaluation at 10, then step 11
    [v] = resumed_from_latest(evaluated_or_retrained(14, 11), DET)
    assert v.status == "pass", v.line()


def test_first_report_at_the_checkpoint_step_without_evidence_is_unverifiable_never_a_pass():
    # the fault right after checkpoint 10: nothing before it says what step 11 should give
    [v] = resumed_from_latest(evaluated_or_retrained(10, 11), DET)
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: resumed at the checkpoint's own step", v.line()
    assert "no earlier attempt (nor a fault-free baseline) reported step 11 with a state value" in v.message
    assert "--chaos-state-metric" in v.message
    # no state metric at all: the same
    tl = (Script().start_attempt().steps(1, 12).fault().decision().start_attempt()
          .report({0: 10, 1: 10}).steps(11, 20).finish().timeline())
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "unverifiable" and "no state value at step 11 in attempt 1" in v.message, v.line()


def test_at_the_checkpoint_step_with_no_earlier_value_the_fault_free_baseline_decides():
    # the fault right after checkpoint 10 (attempt 0 never reported step 11): a baseline did
    from chaos.verdicts import Baseline

    base = Baseline("k", trajectory={r: [[s, {"loss": train_loss(r, s)}] for s in range(1, 21)] for r in (0, 1)})
    healthy = evaluated_or_retrained(10, 11)
    for e in healthy.events:
        if e.kind == "controller_started":
            e.data["state_metric"] = "loss"
    [v] = resumed_from_latest(healthy, Expect(deterministic=True, baseline=True, reference=base))
    assert v.status == "pass" and "step 11 reproduced" in v.evidence["rule"], v.line()
    assert v.evidence["rule"].endswith("of the fault-free baseline"), v.evidence["rule"]
    retrained = evaluated_or_retrained(10, 11, every_after=None, state_after=lambda r, s: train_loss(r, s) * 1.1)
    for e in retrained.events:
        if e.kind == "controller_started":
            e.data["state_metric"] = "loss"
    [v] = resumed_from_latest(retrained, Expect(deterministic=True, baseline=True, reference=base))
    assert v.status == "fail" and v.diagnosis == "state not restored", v.line()
    assert "but " in v.message and "in the fault-free baseline: step 10 was trained again" in v.message
    [v] = resumed_from_latest(retrained, DET)  # without the baseline: no evidence, never a pass
    assert v.status == "unverifiable", v.line()


def test_every_report_a_checkpoint_restart_at_the_first_checkpoint_step_is_a_restart_from_scratch():
    # checkpoints on every report, the fault after the first: a start over commits step 5 again
    [v] = resumed_from_latest(checkpoint_only_reports((5, 10)), DET)
    assert v.status == "fail" and v.diagnosis == "restarted from scratch", v.line()
    assert "the run's first checkpoint, was trained and committed again" in v.message


def test_gradient_accumulation_global_step_advancing_by_four():
    tl = (Script().start_attempt().steps(4, 20, every=8, stride=4).fault().decision()
          .start_attempt().steps(20, 40, every=8, stride=4).finish().timeline())
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "pass", v.line()
    tl = (Script().start_attempt().steps(4, 20, every=8, stride=4).fault().decision()
          .start_attempt().steps(24, 40, every=8, stride=4).finish().timeline())
    [v] = resumed_from_latest(tl, DET)
    assert v.diagnosis == "resumed past the checkpoint"


def test_older_checkpoint_with_a_stride():
    tl = (Script().start_attempt().steps(3, 21, every=6, stride=3).fault().decision()
          .start_attempt().steps(9, 30, every=6, stride=3).finish().timeline())
    [v] = resumed_from_latest(tl, DET)
    assert v.diagnosis == "resumed from an older checkpoint", v.line()


# -- every rank ---------------------------------------------------------------------------
def test_one_rank_restarting_from_scratch_is_named():
    tl = (Script().start_attempt().steps(1, 12).fault().decision().start_attempt()
          .steps(11, 20, rank_step=lambda r, s: s - 10 if r == 1 else s).finish().timeline())
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "fail" and v.diagnosis == "restarted from scratch"
    assert "rank 1 began attempt 1 at step 1" in v.message
    assert "while rank 0 resumed at 11" in v.message
    assert v.evidence["ranks"][0]["status"] == "pass" and v.evidence["ranks"][1]["status"] == "fail"


def test_ranks_that_disagree_after_a_restart_are_a_finding():
    # each start alone is acceptable (next step / evaluate-after-load), together they disagree
    tl = (Script().start_attempt().steps(1, 12).fault().decision().start_attempt()
          .steps(11, 20, rank_step=lambda r, s: s - 1 if r == 1 else s).finish().timeline())
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "fail" and v.diagnosis == "ranks disagree"
    assert "rank 0 at step 11, rank 1 at step 10" in v.message


def test_ranks_that_always_differed_are_not_a_disagreement():
    tl = (Script().start_attempt().steps(1, 12, rank_step=lambda r, s: s + 100 * r, every=None)
          .report({0: 13, 1: 113}, "/storage/ck").fault().decision().start_attempt()
          .steps(14, 20, rank_step=lambda r, s: s + 100 * r, every=None).finish().timeline())
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "pass", v.line()


# -- checkpoints Ray Train never saw, step values -----------------------------------------
def test_a_run_that_reports_no_checkpoint_is_unverifiable_never_a_pass():
    tl = (Script().start_attempt().steps(1, 12, every=None).fault().decision()
          .start_attempt().steps(1, 20, every=None).finish().timeline())
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "unverifiable"
    assert v.message.startswith("unverifiable: the run reported no checkpoint to Ray Train")


def step_less_checkpoint_after_step_9(restart_at, loss=True):
    """As the recorder makes it: steps 1..9, a checkpoint reported without a step (it holds the
    state after step 9), steps 10..12, the fault; the restart loads it and begins at
    ``restart_at`` (10: right; 11: step 10 skipped), each step's loss that of the state it began
    from (``loss=False``: no loss reported)."""
    run = Recorded(state_metric="auto" if loss else None).start_attempt()
    for s in range(1, 13):
        run.report({"step": s, "loss": train_loss(0, s)} if loss else {"step": s})
        if s == 9:
            run.report({}, "/storage/ck9")
    run.fault().start_attempt()
    for k, s in enumerate(range(restart_at, 21), start=10):
        run.report({"step": s, "loss": train_loss(0, k)} if loss else {"step": s})
    return run.finish().timeline()


def test_a_step_less_checkpoint_after_step_9_is_judged_by_the_restarts_state_value():
    # the recorder gives the checkpoint no step (it used to give it rank 0's last, 9, which
    # this test once took as given): after step 9 or before step 10's metrics, the first
    # state value decides — a restart at 10 from the state after 9 passes ...
    [v] = resumed_from_latest(step_less_checkpoint_after_step_9(10), DET)
    assert v.status == "pass" and v.evidence["latest_checkpoint_step"] == 9, v.line()
    assert "step 10 reproduced" in v.message, v.line()
    # ... its twin that skips step 10 fails ...
    [v] = resumed_from_latest(step_less_checkpoint_after_step_9(11), DET)
    assert v.status == "fail" and v.diagnosis is Diagnosis.PAST_THE_CHECKPOINT, v.line()
    # ... and with no state value nothing tells: unverifiable, never the pass it once was
    [v] = resumed_from_latest(step_less_checkpoint_after_step_9(10, loss=False), DET)
    assert v.status == "unverifiable" and v.diagnosis is Diagnosis.CHECKPOINT_STEP_AMBIGUOUS, v.line()
    assert v.evidence["latest_checkpoint_step"] is None


def stepless_checkpoint_then_restart(later_checkpoint):
    """Rank 1's first report is checkpoint 5 without a step (none to carry over, so the
    recorder leaves it out); ``later_checkpoint``: checkpoint 10, with both steps, follows."""
    s = Script().start_attempt()
    s.report({0: 5, 1: None}, "/storage/checkpoint_5")
    s.steps(6, 12, every=10 if later_checkpoint else None).fault().decision()
    return s.start_attempt().steps(11 if later_checkpoint else 6, 20, every=None).finish().timeline()


def test_latest_checkpoint_without_a_rank_step_is_unverifiable_for_that_rank():
    [v] = resumed_from_latest(stepless_checkpoint_then_restart(later_checkpoint=False), DET)
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no step at the checkpoint", v.line()
    assert v.message == "unverifiable: attempt 1, rank 1: the latest checkpoint's report carried no step for rank 1"
    assert v.evidence["ranks"][0]["status"] == "pass"  # rank 0 did resume right after it
    assert v.evidence["ranks"][1]["diagnosis"] == "unverifiable: no step at the checkpoint"
    with pytest.raises(VerificationError, match="carried no step for rank 1"):
        check([v])


def test_a_rank_step_missing_only_at_an_older_checkpoint_is_judged():
    [v] = resumed_from_latest(stepless_checkpoint_then_restart(later_checkpoint=True), DET)
    assert v.status == "pass", v.line()
    assert v.evidence["latest_checkpoint_step"] == 10
    assert "resumed at step 11, right after the latest checkpoint (step 10) on every rank" in v.message


def checkpoint_only_reports(resumed_steps):
    """A script that reports only when it checkpoints (every 5 steps): one report before the
    fault (step 5), then ``resumed_steps`` (first, last) after it."""
    first, last = resumed_steps
    return (Script().start_attempt().steps(5, 5, every=5, stride=5).fault().decision()
            .start_attempt().steps(first, last, every=5, stride=5).finish().timeline())


def test_no_report_after_the_checkpoint_and_no_stride_is_unverifiable():
    [v] = resumed_from_latest(checkpoint_only_reports((10, 10)), DET)
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no reporting stride", v.line()
    assert v.message == ("unverifiable: attempt 1, rank 0: no report followed checkpoint step 5 and the reports "
                         "before the fault showed no stride")
    assert v.evidence["reporting_stride"] == {}
    assert v.evidence["ranks"][1]["diagnosis"] == "unverifiable: no reporting stride"


def test_the_stride_comes_from_the_reports_before_the_fault_only():
    # a stride shown only after the restart does not vouch for the restart's own first step
    [v] = resumed_from_latest(checkpoint_only_reports((10, 15)), DET)
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no reporting stride", v.line()
    # stride 5 before the fault; the restart skips a save interval and keeps a doubled
    # stride (20, 30, 40): its own votes would make 10 the stride and 20 "right after 10"
    tl = (Script().start_attempt().steps(5, 10, every=5, stride=5).fault().decision()
          .start_attempt().steps(20, 40, every=10, stride=10).finish().timeline())
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "fail" and v.diagnosis == "resumed past the checkpoint", v.line()
    assert v.evidence["reporting_stride"] == {0: 5, 1: 5}
    # its healthy twin: resumes at 15 and goes on by 5
    tl = (Script().start_attempt().steps(5, 10, every=5, stride=5).fault().decision()
          .start_attempt().steps(15, 40, every=5, stride=5).finish().timeline())
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "pass" and v.evidence["rule"] == "checkpoint step 10 + the run's reporting stride 5 before the fault"


def test_a_resumed_attempt_that_reports_without_a_step_is_unverifiable_and_names_what_it_reported():
    s = Script().start_attempt().steps(1, 12).fault().decision().start_attempt()
    for _ in range(3):
        s.report({0: None, 1: None}, metrics={"loss": 0.5, "epoch": 2})
    [v] = resumed_from_latest(s.finish().timeline(), DET)
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no step after the restart", v.line()
    assert v.message == ("unverifiable: attempt 1 reported 3 time(s) without the step metric 'step' "
                         "(it reported 'epoch', 'loss')")
    # the step metric renamed between attempts is named
    s = Script().start_attempt().steps(1, 12).fault().decision().start_attempt()
    s.report({0: None, 1: None}, metrics={"global_step": 11, "loss": 0.5})
    [v] = resumed_from_latest(s.finish().timeline(), DET)
    assert "the step metric changed name between attempts: 'step' before, 'global_step' now" in v.message, v.line()
    # the twin: the same attempt with its step is judged (and passes)
    tl = Script().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(11, 20).finish().timeline()
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "pass", v.line()


def epoch_local(restart_from):
    """Epochs of 5 steps counted 0..4 each, a checkpoint at each epoch's end (step 4); the
    fault in epoch 2; the restart counts from ``restart_from``."""
    s = Script().start_attempt()
    for epoch in range(2):
        for step in range(5):
            s.report({0: step, 1: step}, f"/storage/epoch_{epoch}" if step == 4 else None)
    s.report({0: 0, 1: 0}).fault().decision().start_attempt()
    for step in range(restart_from, 5):
        s.report({0: step, 1: step})
    return s.finish().timeline()


def test_a_step_counter_that_resets_every_epoch_is_unverifiable_not_a_resume():
    # a restart from scratch reports step 0 — what also follows the epoch-end checkpoint
    for restart_from in (0, 1):
        [v] = resumed_from_latest(epoch_local(restart_from), DET)
        assert v.status == "unverifiable" and v.diagnosis == "unverifiable: step metric goes back", v.line()
        assert "step metric 'step' goes back: rank 0 reported step 4, then 0 in attempt 0" in v.message
    # a counter that only grows (the twin) is judged
    [v] = resumed_from_latest(Script().start_attempt().steps(1, 12).fault().decision().start_attempt()
                              .steps(1, 20).finish().timeline(), DET)
    assert v.diagnosis == "restarted from scratch", v.line()


def test_fractional_epoch_steps_are_compared_with_a_tolerance():
    # steps as fractional epochs (0.1, 0.2, ...) that float arithmetic leaves a hair off
    def epochs(first, last):
        return [round(i * 0.1, 10) + (1e-12 if i % 3 else 0.0) for i in range(first, last + 1)]

    s = Script().start_attempt()
    for i, e in zip(range(1, 13), epochs(1, 12)):
        s.report({0: e, 1: e}, f"/storage/ck_{i}" if i % 5 == 0 else None)
    s.fault().decision().start_attempt()
    for e in epochs(11, 20):
        s.report({0: e + 3e-12, 1: e + 3e-12})
    [v] = resumed_from_latest(s.finish().timeline(), DET)
    assert v.status == "pass", v.line()


def test_at_the_checkpoint_step_a_next_step_that_does_not_reproduce_warns_for_a_nondeterministic_script():
    tl = evaluated_or_retrained(12, 11, every_after=None, state_after=lambda r, s: train_loss(r, s) * 1.1)
    [v] = resumed_from_latest(tl, Expect(deterministic=False))
    assert v.status == "warning" and v.diagnosis == "state differs", v.line()
    assert "began at the checkpoint's own step 10" in v.message and "not declared deterministic" in v.message
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "fail" and v.diagnosis == "state not restored"


def survivors_commit(without, resume_at, survivor_steps=(13, 13)):
    """Three ranks, checkpoints every 5th step; rank 1's node is preempted after step 12 and
    ranks 0 and 2 commit checkpoint 13 without it (``without``: the recorder's without_ranks);
    every rank of the next attempt first reports ``resume_at``."""
    s = Script(ranks=3).start_attempt().steps(1, 12, every=5).preemption(window_s=8.0)
    s.events.append(s._e("recorder", "train_preemption_notice", 0.0, attempt=s.attempt, preempted_ranks=[1]))
    s.report({0: survivor_steps[0], 2: survivor_steps[1]}, "/storage/checkpoint_13")
    if without:
        s.events[-1].data["without_ranks"] = [1]
    s.gone().decision(budget_class="preemption").start_attempt().steps(resume_at, 20, every=None).finish()
    return s.timeline()


def test_a_checkpoint_the_survivors_committed_without_a_preempted_rank_judges_that_rank_too():
    [v] = resumed_from_latest(survivors_commit(without=True, resume_at=14), DET)
    assert v.status == "pass", v.line()
    assert "committed by rank 0, 2 without rank 1, which was being preempted" in v.evidence["ranks"][1]["rule"], \
        v.evidence
    # the buggy twin: every rank restarts at 11 (a restore of checkpoint 10): rank 1 included
    [v] = resumed_from_latest(survivors_commit(without=True, resume_at=11), DET)
    assert v.status == "fail" and v.diagnosis == "resumed from an older checkpoint", v.line()


def test_a_commit_without_a_rank_nobody_explains_or_whose_survivors_disagree_is_unverifiable():
    # no without_ranks: nothing says why rank 1 is missing from the commit
    [v] = resumed_from_latest(survivors_commit(without=False, resume_at=14), DET)
    assert v.status == "unverifiable" and "carried no step for rank 1" in v.message, v.line()
    # the survivors committed it at different steps: which one is rank 1's is not known
    [v] = resumed_from_latest(survivors_commit(without=True, resume_at=14, survivor_steps=(13, 12)), DET)
    assert v.status != "pass" and v.evidence["ranks"][1]["status"] == "unverifiable", v.line()
    assert v.evidence["ranks"][1]["why"] == "the latest checkpoint's report carried no step for rank 1", v.evidence


# -- a state value decides only what it can tell apart ---------------------------------------------
def stepless_checkpoint_then(restart_at, loss_of):
    """Every 5th step a checkpoint reported before that step's metrics (``report({}, ck)``),
    so it holds the state after step s-1 or after s; the restart loads checkpoint 10 (the
    state after step 10) and begins at ``restart_at`` (10: step 10 trained twice; 11: right).
    ``loss_of(k)``: the loss of a step begun from the state after k steps."""
    run = Recorded().start_attempt()
    for s in range(1, 13):
        if s % 5 == 0:
            run.report({}, f"/storage/ck{s}")
        run.report({"step": s, "loss": loss_of(s - 1)})
    run.fault().start_attempt()
    for k, s in enumerate(range(restart_at, 21), start=10):
        run.report({"step": s, "loss": loss_of(k)})
    return run.finish().timeline()


def test_a_state_value_that_both_readings_of_the_checkpoint_give_decides_nothing():
    # a loss that does not move: step 10 trained twice reproduces it as well as a right restart
    for restart_at in (10, 11):
        [v] = resumed_from_latest(stepless_checkpoint_then(restart_at, lambda k: 1.0), DET)
        assert v.status == "unverifiable" and v.diagnosis is Diagnosis.STATE_DOES_NOT_TELL, v.line()
    # a loss that moves less than the suite's tolerance per step (0.1 % a step, rtol 1 %): the same
    loose = dataclasses.replace(DET, state_rtol=1e-2)
    [v] = resumed_from_latest(stepless_checkpoint_then(10, lambda k: 1.0 - 0.001 * k), loose)
    assert v.status == "unverifiable" and v.diagnosis is Diagnosis.STATE_DOES_NOT_TELL, v.line()
    assert "within the tolerance (rtol 0.01)" in v.message, v.line()
    # twin: a loss that moves with every step tells them apart — step 10 trained twice fails, 11 passes
    moving = lambda k: 10.0 / (k + 1)  # noqa: E731
    [v] = resumed_from_latest(stepless_checkpoint_then(10, moving), DET)
    assert v.status == "fail" and v.diagnosis is Diagnosis.TRAINED_AGAIN, v.line()
    [v] = resumed_from_latest(stepless_checkpoint_then(11, moving), DET)
    assert v.status == "pass", v.line()
    [v] = resumed_from_latest(stepless_checkpoint_then(11, lambda k: 1.0 - 0.001 * k), DET)  # rtol 1e-4 tells
    assert v.status == "pass", v.line()


def every_fifth_with_a_stepless_checkpoint(restart_at):
    """Reports every 5th step, checkpoint 15 reported without a step between steps 10 and 15:
    it holds the state after step 10 or after 15.  The restart first reports ``restart_at``."""
    run = Recorded().start_attempt()
    for s in range(5, 16, 5):
        if s == 15:
            run.report({}, "/storage/ck15")
        run.report({"step": s, "loss": train_loss(0, s)})
    run.fault().start_attempt()
    for s in range(restart_at, 21):
        run.report({"step": s, "loss": train_loss(0, s)})
    return run.finish().timeline()


FAULT_FREE = Baseline("k", trajectory={r: [[s, {"auto": train_loss(0, s)}] for s in range(1, 21)] for r in (0, 1)},
                      job_id="b1", made_at="then")


def test_a_reproduced_value_passes_no_restart_that_no_reading_has_right():
    # step 13: between 10 and 15 if the checkpoint holds step 10 (steps 11-12 unreported or
    # skipped), before the checkpoint if it holds 15; reproducing the baseline's step 13
    # fits both (11-12 trained unreported, or an older checkpoint loaded): never a pass
    [v] = resumed_from_latest(every_fifth_with_a_stepless_checkpoint(13),
                              Expect(deterministic=True, baseline=True, reference=FAULT_FREE))
    assert v.status == "unverifiable" and v.diagnosis is Diagnosis.CHECKPOINT_STEP_AMBIGUOUS, v.line()
    assert "under no reading did attempt 1 begin where it should" in v.message, v.line()
    # twin: step 11, right after the checkpoint if it holds step 10, reproduces — and the value
    # the other reading's state (step 16's, 5 updates further) gives is another: a pass
    [v] = resumed_from_latest(every_fifth_with_a_stepless_checkpoint(11),
                              Expect(deterministic=True, baseline=True, reference=FAULT_FREE))
    assert v.status == "pass" and "step 11 reproduced" in v.message, v.line()


def test_an_evaluation_at_the_checkpoint_step_is_not_told_from_the_step_trained_again_by_a_loose_tolerance():
    # the next trained step reproduces within rtol 1 %, but so would step 10 trained again:
    # the loss moves 0.1 % a step
    slow = lambda r, s: 1.0 - 0.001 * s + r  # noqa: E731
    tl = evaluated_or_retrained(12, 11, state_after=slow)
    for e in tl.events:
        if e.kind == "report" and e.attempt == 0:
            e.data["states"] = {k: slow(int(k), e.data["steps"][k]) for k in e.data["steps"]}
    [v] = resumed_from_latest(tl, dataclasses.replace(DET, state_rtol=1e-2))
    assert v.status == "unverifiable" and v.diagnosis is Diagnosis.STATE_DOES_NOT_TELL, v.line()
    # twin: the same run at the default tolerance tells one update apart
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "pass" and "step 11 reproduced" in v.evidence["rule"], v.line()

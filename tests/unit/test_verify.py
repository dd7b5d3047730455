"""Every verdict and diagnosis, on recorded timelines."""

import pytest

from chaos.errors import VerificationError
from chaos.verdicts import Diagnosis, Expect, check, judge
from chaos.verdicts.healed import healed
from chaos.verdicts.preemption import preemption_window
from chaos.verdicts.recovery import recovery_time
from chaos.verdicts.resume import resumed_from_latest
from chaos.verdicts.run_finished import run_finished
from chaos.verdicts.state import state_restored
from chaos.verdicts.budget import within_budget
from timelines import Script

DET = Expect(deterministic=True)  # the old verdict functions' default

EXPECT_ONE = Expect(charged={"worker_group": 1}, slo_detect_s=10, slo_recover_s=60)


def good_run():
    return (Script().start_attempt().steps(1, 12).fault().decision()
            .start_attempt().steps(11, 20).finish())


def test_correct_resume_passes_every_verdict():
    verdicts = judge(good_run().timeline(), EXPECT_ONE)
    assert [v.status for v in verdicts] == ["pass"] * 4, [v.line() for v in verdicts]
    resume = verdicts[0]
    assert resume.evidence["latest_checkpoint_step"] == 10
    assert resume.evidence["first_step_of_attempt"] == 11
    check(verdicts)


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


def test_budget_exhausted_unexpectedly_fails_with_the_count_and_limit():
    tl = Script(max_failures=0).start_attempt().steps(1, 6).fault().decision("RAISE", limit=0).finish("ERRORED").timeline()
    v = within_budget(tl, EXPECT_ONE)
    assert v.status == "fail"
    assert v.message == "retry budget exhausted: 1 failure charged to max_failures=0"
    assert run_finished(tl, EXPECT_ONE).status == "fail"


def test_budget_exhausted_as_expected_is_an_expected_verdict():
    tl = Script(max_failures=0).start_attempt().steps(1, 6).fault().decision("RAISE", limit=0).finish("ERRORED").timeline()
    expect = Expect(charged={"worker_group": 1}, budget_exhausted=True)
    v = within_budget(tl, expect)
    assert v.status == "expected" and "1 failure charged to max_failures=0" in v.message
    assert run_finished(tl, expect).status == "expected"
    assert resumed_from_latest(tl, DET) == []


def test_expected_exhaustion_that_never_happens_fails():
    v = within_budget(good_run().timeline(), Expect(charged={"worker_group": 1}, budget_exhausted=True))
    assert v.status == "fail" and v.diagnosis == "budget not exhausted"


def test_wrong_budget_class_is_a_finding():
    tl = (Script().start_attempt().steps(1, 12).fault().decision(budget_class="preemption", limit=None)
          .start_attempt().steps(11, 20).finish().timeline())
    v = within_budget(tl, EXPECT_ONE)
    assert v.status == "fail" and v.diagnosis == "charged to the wrong budget class"
    assert "preemption" in v.message


def test_the_summary_charges_each_budget_class_as_the_verdicts_count_it():
    """summary.json's charged figures are verify.charged's (the runs the faults hit): a
    preemption and a failure in the faulted run, an evaluation fit's own failures after it."""
    from chaos.summary import metrics_for
    from chaos.verdicts.budget import charged

    s = (Script().start_attempt().steps(1, 12).preemption().gone().decision(budget_class="preemption", limit=2)
         .start_attempt().steps(11, 16).fault().decision().start_attempt().steps(16, 20).finish())
    s.new_run().start_attempt().steps(1, 2).decision().start_attempt().steps(1, 2).decision().start_attempt()
    tl = s.steps(1, 3).finish().timeline()
    counted = charged(tl)
    summed = metrics_for(tl, {"max_failures": 3, "max_preemption_failures": 2, "controller_failure_limit": -1})["charged"]
    assert {c: summed[c] for c in counted} == {c: {"count": d["count"], "limit": d["limit"]} for c, d in counted.items()}
    assert summed == {"worker_group": {"count": 1, "limit": 3}, "preemption": {"count": 1, "limit": 2},
                      "controller": {"count": 0, "limit": -1}}


def test_wrong_charge_count_is_a_finding():
    v = within_budget(good_run().timeline(), Expect(charged={"worker_group": 2}))
    assert v.status == "fail" and v.diagnosis == "unexpected number of charged failures"


def test_decision_without_ray_accounting_is_unverifiable():
    s = Script().start_attempt().steps(1, 12).fault()
    s.events.append(s._e("recorder", "failure_decision", attempt=0, decision="RETRY"))
    v = within_budget(s.start_attempt().steps(11, 20).finish().timeline(), EXPECT_ONE)
    assert v.status == "unverifiable"


def test_recovery_slower_than_slo_fails():
    [v] = recovery_time(good_run().timeline(), Expect(slo_recover_s=0.5))
    assert v.status == "fail" and v.message.startswith("recovery too slow")
    assert v.evidence["time_to_detect"] == pytest.approx(1.5)
    [v] = recovery_time(good_run().timeline(), Expect(slo_detect_s=1.0))
    assert v.status == "fail" and "time to detect 1.5 s > SLO 1.0 s" in v.message


def test_never_recovering_fails():
    tl = Script().start_attempt().steps(1, 12).fault().timeline()
    [v] = recovery_time(tl, EXPECT_ONE)
    assert v.status == "fail" and "never resumed" in v.message
    assert run_finished(tl, EXPECT_ONE).diagnosis == "run did not finish"


def test_healed_lists_every_problem():
    v = healed(False, "hosts down: ['worker-2']", [{"fault": "partition", "id": "abc"}], False, "1 of 3 CPUs free")
    assert v.status == "fail" and v.message.startswith("cleanup failed")
    assert "worker-2" in v.message and "partition@abc" in v.message and "1 of 3 CPUs" in v.message
    assert healed(True, "all alive", [], True, "all CPUs free").status == "pass"


def test_check_raises_an_assertion_with_every_failed_message():
    tl = Script(max_failures=0).start_attempt().steps(1, 6).fault().decision("RAISE", limit=0).finish("ERRORED").timeline()
    with pytest.raises(VerificationError) as err:
        check(judge(tl, EXPECT_ONE))
    assert isinstance(err.value, AssertionError)
    assert str(err.value).startswith("retry budget exhausted: 1 failure charged to max_failures=0")


def test_exhaustion_of_the_wrong_budget_is_a_finding_even_when_exhaustion_is_expected():
    tl = (Script(max_failures=0).start_attempt().steps(1, 6).fault().decision("RAISE", budget_class="preemption", limit=0)
          .finish("ERRORED").timeline())
    v = within_budget(tl, Expect(charged={"worker_group": 1}, budget_exhausted=True))
    assert v.status == "fail" and v.diagnosis == "charged to the wrong budget class"
    assert "max_preemption_failures=0" in v.message


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


def train_loss(rank, step):
    """A deterministic training loss per (rank, step)."""
    return 10.0 / step + rank


def evaluated_or_retrained(before_fault, first_step_after, every_after=5, state_after=train_loss):
    """Steps 1..``before_fault`` (a checkpoint every 5th), the fault, then an attempt whose
    first report is step 10 — the checkpoint's own step — with an evaluation's value, and
    steps ``first_step_after``.. trained with ``state_after``."""
    s = Script().start_attempt().steps(1, before_fault, state=train_loss).fault().decision().start_attempt()
    s.report({0: 10, 1: 10}, states={0: 99.0, 1: 99.0})
    return s.steps(first_step_after, 20, every=every_after, state=state_after).finish().timeline()


def test_first_report_at_the_checkpoint_step_passes_when_the_next_trained_step_reproduces():
    # evaluate after load: step 11 (trained after it) gives what attempt 0 gave for step 11
    [v] = resumed_from_latest(evaluated_or_retrained(12, 11), DET)
    assert v.status == "pass", v.line()
    assert "at the latest checkpoint's own step (10), evaluating after loading it" in v.message
    assert "step 11 reproduced" in v.evidence["rule"]


def test_state_restored_leaves_the_evaluation_at_the_checkpoint_step_to_the_resume_rule():
    """The evaluation's value at step 10 (99.0, after the update) cannot reproduce attempt 0's
    pre-update step 10: not compared, so a correct evaluate-after-restore is no state finding;
    the re-done step 11 still is compared, and a lost state there still fails."""
    [v] = state_restored(evaluated_or_retrained(12, 11), DET)
    assert v.status == "pass" and v.evidence["compared"] and all(c["step"] != 10 for c in v.evidence["compared"]), \
        v.line()
    [v] = state_restored(evaluated_or_retrained(12, 11, state_after=lambda r, s: train_loss(r, s) * 1.1), DET)
    assert v.status == "fail" and v.diagnosis == "state not restored" and "at re-done step 11" in v.message, v.line()
    # a report at step 10 that is not the attempt's first (a resume from checkpoint 5) is re-done work, compared
    tl = (Script().start_attempt().steps(1, 12, state=train_loss).fault().decision().start_attempt()
          .steps(6, 20, state=lambda r, s: train_loss(r, s) * (1.1 if s == 10 else 1)).finish().timeline())
    [v] = state_restored(tl, DET)
    assert v.status == "fail" and "at re-done step 10" in v.message, v.line()


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


def test_a_state_metric_that_does_not_move_with_training_does_not_decide_a_checkpoint_step_first_report():
    # loss 1.0 at every step: step 5's value again says nothing about the state it came from,
    # so the next trained step decides as before (it reproduces: a pass on what can be told)
    s = Script(state_metric="loss").start_attempt()
    for st in range(1, 7):
        s.report({0: st, 1: st}, f"/storage/ck{st}" if st in (4, 5) else None, states={0: 1.0, 1: 1.0})
    s.fault().decision().start_attempt()
    for st in range(5, 9):
        s.report({0: st, 1: st}, states={0: 1.0, 1: 1.0})
    [v] = resumed_from_latest(s.finish().timeline(), DET)
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


def test_checkpoint_report_without_the_step_takes_the_rank_last_step_and_says_so():
    s = Script().start_attempt().steps(1, 9, every=None)
    s.report({0: 9, 1: 9}, "/storage/ck", sources={"0": "last reported", "1": "last reported"})
    tl = s.steps(10, 12, every=None).fault().decision().start_attempt().steps(10, 20, every=None).finish().timeline()
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "pass", v.line()
    assert v.evidence["latest_checkpoint_step"] == 9


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


@pytest.mark.parametrize("value, expected", [(7, 7), (7.0, 7), (7.5, 7.5), ("7", None), (True, None),
                                             (float("nan"), None)])
def test_step_values_ints_whole_floats_and_scalars(value, expected):
    import numpy as np

    from chaos.train.recording import as_number

    assert as_number(value) == expected
    assert as_number(np.int64(7)) == 7 and isinstance(as_number(np.int64(7)), int)
    assert as_number(np.float32(3.0)) == 3


def test_auto_step_metric_names():
    from chaos.train.recording import AUTO_STEP_METRICS, step_metric_names

    assert step_metric_names("auto") == AUTO_STEP_METRICS
    assert step_metric_names("global_step, step") == ("global_step", "step")
    assert step_metric_names("it,auto")[0] == "it"


# -- run identity ---------------------------------------------------------------------------
def test_two_fits_in_one_driver_are_judged_per_run():
    s = (Script().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(11, 20).finish()
         .new_run().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(1, 20).finish())
    verdicts = resumed_from_latest(s.timeline(), DET)
    assert [v.name for v in verdicts] == ["resumed-from-latest (run 1, attempt 1)",
                                          "resumed-from-latest (run 2, attempt 1)"]
    assert [v.status for v in verdicts] == ["pass", "fail"]
    assert verdicts[1].diagnosis == "restarted from scratch"


def test_an_attempt_that_never_reported_is_skipped_for_the_one_that_did():
    s = (Script().start_attempt().steps(1, 12).fault().decision().start_attempt()
         .decision("RETRY", "controller", limit=None, error="The worker group startup timed out after 8.0 seconds",
                   error_types=("ControllerError", "WorkerGroupStartupTimeoutError"))
         .start_attempt().steps(11, 20).finish())
    [v] = resumed_from_latest(s.timeline(), DET)
    assert v.name.endswith("attempt 2)") and v.status == "pass"
    assert v.evidence["attempts_that_never_reported"] == [1]


# -- state, not only the counter ----------------------------------------------------------
def loss(r, s):
    return 1.0 / s + r


def test_redone_steps_reproduce_the_loss():
    tl = (Script(state_metric="loss").start_attempt().steps(1, 12, state=loss).fault().decision()
          .start_attempt().steps(11, 20, state=loss).finish().timeline())
    [v] = state_restored(tl, DET)
    assert v.status == "pass" and "4 re-done report(s)" in v.message


def test_restored_counter_but_not_weights_is_caught():
    tl = (Script(state_metric="loss").start_attempt().steps(1, 12, state=loss).fault().decision()
          .start_attempt().steps(11, 20, state=lambda r, s: loss(r, s) * 1.5).finish().timeline())
    [v] = state_restored(tl, DET)
    assert v.status == "fail" and v.diagnosis == "state not restored"
    assert "re-done step 11" in v.message


def test_no_redone_step_is_not_applicable_not_a_pass():
    tl = (Script(state_metric="loss").start_attempt().steps(1, 10, state=loss).fault().decision()
          .start_attempt().steps(11, 20, state=loss).finish().timeline())
    [v] = state_restored(tl)
    assert v.status == "n/a" and v.message.startswith("not checked")
    assert state_restored(good_run().timeline(), DET) == []  # no state metric recorded
    # a workload declared deterministic showed nothing of its restored state: unverifiable, never n/a
    # (tests/unit/test_verdict_shapes.py has the fault right after a checkpoint, shape 6)
    [v] = state_restored(tl, DET)
    assert v.status == "unverifiable" and v.diagnosis == Diagnosis.TOO_FEW_REDONE, v.line()


# -- faults and charges are matched -------------------------------------------------------
def test_unrelated_failure_is_its_own_finding():
    s = (Script().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(11, 14)
         .decision(error="WorkerGroupError: ValueError: bad batch").start_attempt().steps(11, 20).finish())
    v = within_budget(s.timeline(), EXPECT_ONE)
    assert v.status == "fail" and v.diagnosis == "unrelated failure"
    assert "ValueError: bad batch" in v.message


def test_capacity_waits_after_a_fault_are_its_consequence():
    s = (Script().start_attempt().steps(1, 12).fault().decision().start_attempt()
         .decision("RETRY", "controller", limit=None, error="The worker group startup timed out after 8.0 seconds",
                   error_types=("ControllerError", "WorkerGroupStartupTimeoutError"))
         .start_attempt().steps(11, 20).finish())
    v = within_budget(s.timeline(), EXPECT_ONE)
    assert v.status == "pass", v.line()
    assert "1 to controller_failure_limit while the worker group waited" in v.message


def test_exhaustion_count_must_be_limit_plus_one():
    tl = Script(max_failures=0).start_attempt().steps(1, 6).fault().decision("RAISE", limit=0).finish("ERRORED").timeline()
    v = within_budget(tl, Expect(charged={"worker_group": 1}, budget_exhausted=True))
    assert v.status == "expected"
    s = Script(max_failures=0).start_attempt().steps(1, 6).fault()
    s.failures["worker_group"] = 2
    v = within_budget(s.decision("RAISE", limit=0).finish("ERRORED").timeline(),
                      Expect(charged={"worker_group": 1}, budget_exhausted=True))
    assert v.status == "fail" and v.diagnosis == "unexpected number of charged failures"


# -- recovery time ------------------------------------------------------------------------
def test_recovery_counts_the_attempt_that_recovered():
    s = (Script().start_attempt().steps(1, 12).fault().decision().start_attempt()
         .decision("RETRY", "controller", limit=None, error="The worker group startup timed out after 8.0 seconds",
                   error_types=("ControllerError", "WorkerGroupStartupTimeoutError"))
         .start_attempt().steps(11, 20).finish())
    [v] = recovery_time(s.timeline(), EXPECT_ONE)
    assert v.status == "pass" and v.evidence["recovered_attempt"] == 2


def test_fault_after_the_run_ended_is_inconclusive():
    tl = Script().start_attempt().steps(1, 12).finish().fault().timeline()
    [v] = recovery_time(tl, EXPECT_ONE)
    assert v.status == "unverifiable" and v.message.startswith("inconclusive")


def test_budget_exhaustion_still_checks_detection_time():
    tl = (Script(max_failures=0).start_attempt().steps(1, 6).fault(detect=5.0).decision("RAISE", limit=0)
          .finish("ERRORED").timeline())
    [v] = recovery_time(tl, Expect(charged={"worker_group": 1}, budget_exhausted=True, slo_detect_s=2))
    assert v.status == "fail" and "time to detect 5.0 s > SLO 2.0 s" in v.message


def test_clock_offset_corrects_head_stamped_events():
    from chaos.timeline import Event, Timeline

    tl = Timeline()
    tl.set_clock_offset(100.0, 0.01)  # the head runs 100 s ahead
    assert tl.from_head(1100.0) == 1000.0
    assert tl.of("clock_offset")[0].data["offset_s"] == 100.0
    tl.add(Event(990.0, "fault", "fault_injected", {"ledger_id": "x"}))
    tl.add(Event(tl.from_head(1091.5), "fault", "fault_detected", {"ledger_id": "x"}))
    from chaos.timeline import recovery_metrics

    [m] = recovery_metrics(tl)
    assert m.time_to_detect == pytest.approx(1.5)


# -- run-finished ---------------------------------------------------------------------------
def test_run_finished_requires_the_job_to_succeed():
    s = Script().start_attempt().steps(1, 12).finish(job="FAILED")
    v = run_finished(s.timeline(), EXPECT_ONE)
    assert v.status == "fail" and "the job ended FAILED" in v.message


def exhausted(state, job=None):
    """A run whose one fault exhausts max_failures=0 and that ends ``state``, its job ``job``
    (None: as Script.finish records it)."""
    s = Script(max_failures=0).start_attempt().steps(1, 6).fault().decision("RAISE", limit=0)
    if job is None:
        return s.finish(state).timeline()
    s.events.append(s._e("recorder", "run_finished", state=state))
    s.events.append(s._e("harness", "job_finished", status=job))
    return s.timeline()


EXPECT_EXHAUSTION = Expect(charged={"worker_group": 1}, budget_exhausted=True)


def test_expected_exhaustion_that_does_not_end_errored_did_not_fail_cleanly():
    for tl, ended in [(exhausted("ABORTED"), "ABORTED (job FAILED)"),
                      (exhausted("FINISHED"), "FINISHED (job SUCCEEDED)"),
                      (exhausted("ERRORED", job="SUCCEEDED"), "ERRORED (job SUCCEEDED)")]:  # the driver swallowed it
        v = run_finished(tl, EXPECT_EXHAUSTION)
        assert v.status == "fail" and v.diagnosis == "run did not fail cleanly", v.line()
        assert v.message == f"run did not fail cleanly: it ended {ended}, but budget exhaustion should end it ERRORED"


def test_expected_exhaustion_that_ends_errored_failed_cleanly():
    v = run_finished(exhausted("ERRORED"), EXPECT_EXHAUSTION)
    assert v.status == "expected" and v.diagnosis is None, v.line()
    assert v.evidence["run_state"] == "ERRORED" and v.evidence["job_status"] == "FAILED"


def test_expected_exhaustion_without_the_jobs_status_is_unverifiable_not_expected():
    # ERRORED, but no job record: a driver that swallowed the error (job SUCCEEDED) looks the same
    s = Script(max_failures=0).start_attempt().steps(1, 6).fault().decision("RAISE", limit=0)
    s.events.append(s._e("recorder", "run_finished", state="ERRORED"))
    v = run_finished(s.timeline(), EXPECT_EXHAUSTION)
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no job status", v.line()
    assert "its job's final status was never read" in v.message
    # twin: the job's FAILED status read
    assert run_finished(exhausted("ERRORED"), EXPECT_EXHAUSTION).status == "expected"


def test_stalled_and_did_not_resume_messages():
    from chaos.verdicts.progress import did_not_resume, stalled

    tl = (Script().start_attempt().steps(1, 12).fault().decision().start_attempt()
          .steps(11, 14, rank_step=lambda r, s: s - 10 if r == 1 else s).timeline())
    v = stalled(tl.events, 75, 60, "the job to finish")
    assert v.message.startswith("training stalled: no rank reported for 75 s")
    assert "rank 0 at step 14, rank 1 at step 4" in v.message
    assert did_not_resume("Ray to mark node n1 DEAD", "60 s").diagnosis == "did not resume"


# -- progress: the stall watch ------------------------------------------------------------
def _running(quiet_s, every=1.0, state="RUNNING"):
    """A run that reported every ``every`` s and then went quiet for ``quiet_s`` s."""
    import time as _time

    from chaos.timeline import Event

    now = _time.time()
    t0 = now - quiet_s - 10 * every
    events = [Event(t0 - 1, "recorder", "state_changed", {"cur": "RUNNING"})]
    events += [Event(t0 + i * every, "recorder", "report", {"attempt": 0, "steps": {"0": i + 1, "1": i + 1}})
               for i in range(10)]
    # a recorder that passes Ray's RUNNING -> RUNNING ticks on: not a new entry into RUNNING
    events += [Event(t, "recorder", "state_changed", {"prev": "RUNNING", "cur": "RUNNING"})
               for t in (now - 1, now - 0.5)]
    if state != "RUNNING":
        events.append(Event(now - quiet_s, "recorder", "state_changed", {"cur": state}))
    return events


def test_stall_watch_fires_past_the_derived_limit_with_every_rank_step():
    from chaos.progress import Finding, StallWatch

    watch = StallWatch(floor_s=2)
    watch.waiting_for = "the run to end"
    assert watch.limit(_running(0, every=1.0)) == 3.0  # 3x the longest silence so far
    watch(_running(1.5))  # quiet for less than the limit (2.5 s since the last report): nothing
    with pytest.raises(Finding) as err:
        watch(_running(4))
    v = err.value.verdict
    assert v.diagnosis == "training stalled" and "while waiting for the run to end" in v.message
    assert "rank 0 at step 10, rank 1 at step 10" in v.message
    assert isinstance(err.value, AssertionError)  # a failed test, not a broken harness


def test_stall_limit_has_a_floor_and_an_override():
    from chaos.progress import STALL_FLOOR_S, StallWatch

    assert StallWatch().limit(_running(0, every=0.3)) == STALL_FLOOR_S
    assert StallWatch(limit_s=7).limit(_running(0, every=30)) == 7


def slow_reporter(first_report_s, every, reports, restarted_quiet_s=None):
    """A run whose attempt 0 took ``first_report_s`` from RUNNING to its first report, then
    reported every ``every`` s; with ``restarted_quiet_s``, attempt 1 has been RUNNING for
    that long without a report."""
    import time as _time

    from chaos.timeline import Event

    now = _time.time()
    span = first_report_s + every * (reports - 1) + (restarted_quiet_s + 5 if restarted_quiet_s is not None else 0)
    t = now - span - 1
    events = [Event(t, "recorder", "controller_started", {"run_id": "r"}),
              Event(t, "recorder", "state_changed", {"run_id": "r", "cur": "RUNNING"})]
    t += first_report_s
    for i in range(reports):
        events.append(Event(t + i * every, "recorder", "report", {"run_id": "r", "attempt": 0, "steps": {"0": i}}))
    if restarted_quiet_s is not None:
        events += [Event(now - restarted_quiet_s - 5, "recorder", "state_changed", {"run_id": "r", "cur": "RESTARTING"}),
                   Event(now - restarted_quiet_s, "recorder", "state_changed", {"run_id": "r", "cur": "RUNNING"})]
    return events


def test_a_slow_reporter_is_not_stalled_at_the_floor():
    # a Trainer that saves (and reports) every 150 s: the floor of 60 s would call it stalled
    from chaos.progress import StallWatch

    assert StallWatch().limit(slow_reporter(200, 150, 3)) == 600  # 3x its longest silence (200 s to the first)
    StallWatch()(slow_reporter(200, 150, 3)[:-1])  # 150 s after the 2nd report: still fine


def test_before_an_attempts_first_report_the_limit_comes_from_the_runs_first_report():
    from chaos.progress import Finding, StallWatch

    # attempt 1 RUNNING for 100 s without a report; attempt 0 needed 40 s to its first
    watch = StallWatch(slo_recover_s=30)
    assert watch.limit(slow_reporter(40, 5, 4, restarted_quiet_s=100)) == 150  # 3 x 40 + the recover SLO
    watch(slow_reporter(40, 5, 4, restarted_quiet_s=100))
    with pytest.raises(Finding):
        watch(slow_reporter(40, 5, 4, restarted_quiet_s=160))
    # nothing predicts the run's very first report: the first-report limit
    assert StallWatch(first_report_s=900).limit(slow_reporter(40, 5, 0)) == 900


def test_a_restart_that_never_reports_is_did_not_resume():
    from chaos.progress import Finding, StallWatch

    watch = StallWatch(recover_limit_s=5)
    watch(_running(3, state="RESTARTING"))
    with pytest.raises(Finding) as err:
        watch(_running(8, state="RESTARTING"))
    assert err.value.verdict.diagnosis == "did not resume"
    assert "RESTARTING for 8 s" in err.value.verdict.message
    StallWatch(limit_s=1)(_running(100, state="FINISHED"))  # a finished run is not stalled


# -- preemption-window -----------------------------------------------------------------
def preempted_run(jit_step=None):
    """Checkpoints every 10 steps; the notice comes after step 12, the node goes after step 16."""
    s = Script().start_attempt().steps(1, 12, every=10).preemption(window_s=8.0)
    for step in range(13, 17):
        s.report({0: step, 1: step}, f"/storage/checkpoint_{step}" if step == jit_step else None)
    return s.gone().decision(budget_class="preemption")


def test_preemption_window_reports_notice_deadline_and_the_checkpoint_inside():
    tl = preempted_run(jit_step=14).start_attempt().steps(15, 20, every=10).finish().timeline()
    [v] = preemption_window(tl, Expect(checkpoint_in_window=True))
    assert v.status == "pass", v.line()
    assert v.evidence["checkpoint_steps"] == [14] and v.evidence["window_s"] == 8.0
    assert "deadline +8.0 s" in v.message and "inside the window at step 14" in v.message
    assert v.evidence["death_reason"].startswith("Terminated due to preemption")
    [resume] = resumed_from_latest(tl, DET)
    assert resume.status == "pass" and resume.evidence["latest_checkpoint_step"] == 14


def test_missing_just_in_time_checkpoint_is_a_finding():
    tl = preempted_run().start_attempt().steps(11, 20, every=10).finish().timeline()
    [v] = preemption_window(tl, Expect(checkpoint_in_window=True))
    assert v.status == "fail" and v.diagnosis == "no just-in-time checkpoint", v.line()
    assert "no checkpoint committed inside the window" in v.message


def test_checkpoint_inside_a_window_that_must_have_none_is_a_finding():
    tl = preempted_run(jit_step=14).start_attempt().steps(15, 20, every=10).finish().timeline()
    [v] = preemption_window(tl, Expect(checkpoint_in_window=False))
    assert v.status == "fail" and v.diagnosis == "checkpoint inside the preemption window", v.line()
    assert v.message.startswith("checkpoint inside the preemption window: notice at +0 s (drain), deadline +8.0 s")
    assert "checkpoint committed inside the window at step 14" in v.message
    assert v.evidence["checkpoint_steps"] == [14]


def test_checkpoints_only_before_the_notice_and_after_the_node_went_are_outside_the_window():
    # checkpoint 10 before the notice, checkpoint 20 in the attempt after the node went
    tl = preempted_run().start_attempt().steps(11, 20, every=10).finish().timeline()
    [v] = preemption_window(tl, Expect(checkpoint_in_window=False))
    assert v.status == "pass" and v.diagnosis is None, v.line()
    assert "no checkpoint committed inside the window" in v.message and v.evidence["checkpoint_steps"] == []


def test_preemption_window_without_expectation_reports_without_passing():
    tl = preempted_run(jit_step=14).start_attempt().steps(15, 20, every=10).finish().timeline()
    [v] = preemption_window(tl, Expect())
    assert v.status == "n/a" and "not required either way" in v.message


def test_preemption_charged_to_the_preemption_budget_is_within_budget():
    tl = preempted_run().start_attempt().steps(11, 20, every=10).finish().timeline()
    v = within_budget(tl, Expect(charged={"preemption": 1}))
    assert v.status == "pass" and "charged 1 to max_preemption_failures" in v.message, v.line()
    v = within_budget(tl, Expect(charged={"worker_group": 1}))
    assert v.status == "fail" and v.diagnosis == "charged to the wrong budget class", v.line()


# -- one run per verdict: the run the fault hit, not a warm-up before it or an eval after it ----
def faulted_then_evaluated(restarted=True):
    """Run 1 is hit by the fault (restarted or not) and ends ERRORED; the driver then runs
    an evaluation fit() (run 2) that finishes, and the job succeeds."""
    s = Script().start_attempt().steps(1, 12).fault().decision("RAISE", limit=0)
    if restarted:
        s.start_attempt().steps(11, 14)
    s.events.append(s._e("recorder", "run_finished", state="ERRORED"))
    s.new_run().start_attempt().steps(1, 3, every=None).finish()
    return s.timeline()


def test_run_finished_judges_the_run_the_fault_hit_not_a_later_fit():
    v = run_finished(faulted_then_evaluated(), EXPECT_ONE)
    assert v.status == "fail" and v.diagnosis == "run failed" and "ended ERRORED" in v.message, v.line()
    # its twin: the faulted run itself finishes
    s = Script().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(11, 20).finish()
    assert run_finished(s.timeline(), EXPECT_ONE).status == "pass"


def test_a_later_fit_is_not_the_faulted_runs_recovery():
    from chaos.timeline import recovery_metrics

    [m] = recovery_metrics(faulted_then_evaluated(restarted=False))
    assert m.recovered_attempt is None and m.time_to_recover is None, m
    [m] = recovery_metrics(faulted_then_evaluated(restarted=True))
    assert m.recovered_attempt == 1, m


def test_within_budget_judges_the_faulted_run_not_a_warm_up():
    # a warm-up fit() that failed once and retried on its own, then the faulted run
    s = Script(max_failures=3).start_attempt().steps(1, 3, every=None).decision(error="warm-up flake")
    s.start_attempt().steps(1, 3, every=None)
    s.events.append(s._e("recorder", "run_finished", state="FINISHED"))
    s.new_run().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(11, 20).finish()
    v = within_budget(s.timeline(), EXPECT_ONE)
    assert v.status == "pass" and "charged 1 to max_failures=3" in v.message, v.line()
    assert v.evidence["unrelated"] == []


def test_final_state_is_the_faulted_runs():
    from chaos.verdicts.states import final_states

    s = Script(state_metric="loss").start_attempt().steps(1, 12, state=loss).fault().decision()
    s.start_attempt().steps(11, 20, state=loss)
    s.events.append(s._e("recorder", "run_finished", state="FINISHED"))
    s.new_run().start_attempt().steps(1, 3, every=None, state=loss).finish()
    assert final_states(s.timeline())[0]["step"] == 20


def test_an_evaluation_at_the_checkpoint_step_after_the_checkpoint_is_not_the_next_step():
    # each checkpoint report is followed by an eval report at the same step (10, 10, 11, ...)
    s = Script().start_attempt()
    for step in range(1, 13):
        s.report({0: step, 1: step}, f"/storage/checkpoint_{step}" if step % 5 == 0 else None)
        if step % 5 == 0:
            s.report({0: step, 1: step})
    tl = s.fault().decision().start_attempt().steps(11, 20).finish().timeline()
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "pass" and "resumed at step 11, right after the latest checkpoint (step 10)" in v.message, \
        v.line()
    # the twin that skips data is still caught
    tl = (Script().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(13, 20).finish().timeline())
    [v] = resumed_from_latest(tl, DET)
    assert v.diagnosis == "resumed past the checkpoint", v.line()


# -- findings, not harness errors ----------------------------------------------------------
def looping(limit, failures=3, progress=False):
    """A run that restarts again and again after its fault, under ``limit`` (None: unlimited)."""
    s = Script(max_failures=-1).start_attempt().steps(1, 12).fault()
    for i in range(failures):
        s.decision(limit=limit, error=f"RuntimeError: CUDA error: an illegal memory access ({i})")
        s.start_attempt()
        if progress and i == failures - 1:
            s.steps(13, 13, every=None)
        else:
            s.steps(11, 12, every=None)
    return s.events


def test_a_crash_loop_under_an_unlimited_budget_is_a_finding():
    from chaos.progress import Finding, StallWatch
    from chaos.verdicts.progress import crash_loop

    v = crash_loop(looping(None), 3)
    assert v is not None and v.diagnosis == "crash loop" and v.status == "fail", v
    assert v.message.startswith("crash loop: 3 failures in a row without a step beyond 12")
    assert "CUDA error" in v.message
    with pytest.raises(Finding):
        StallWatch()(looping("-1"))
    # its twins: progress between the failures, a finite budget (it ends by itself), fewer failures
    assert crash_loop(looping(None, progress=True), 3) is None
    assert crash_loop(looping(5), 3) is None
    assert crash_loop(looping(None, failures=2), 3) is None
    # capacity waits while a node recovers are not a loop
    s = Script().start_attempt().steps(1, 12).fault()
    for _ in range(4):
        s.decision(budget_class="controller", limit=None, error="startup timed out",
                   error_types=("ControllerError", "WorkerGroupStartupTimeoutError"))
    assert crash_loop(s.events, 3) is None


def test_a_run_that_ends_before_the_trigger_is_a_finding_naming_the_trigger():
    from chaos.triggers import run_ended
    from chaos.verdicts.progress import ended_before_fault

    s = Script().start_attempt().steps(1, 7).finish()
    ended = run_ended(s.events)
    v = ended_before_fault(1, "after checkpoint 2 is committed", ended)
    assert v.status == "fail" and v.diagnosis == "run ended before the fault", v
    assert v.message.startswith("run ended before the fault: fault 1 waited after checkpoint 2 is committed, but "
                                "recorder.run_finished")
    # once a wait is over, a warm-up fit() that ended is not the end: the run after it is
    w = Script().start_attempt().steps(1, 3)
    w.events.append(w._e("recorder", "run_finished", state="FINISHED"))
    w.new_run().start_attempt().steps(1, 2)
    assert run_ended(w.events) is None


def test_a_finish_phase_timeout_is_a_finding_driver_hang_or_run_not_finished():
    from chaos.verdicts.run_finished import did_not_end

    s = Script().start_attempt().steps(1, 20)
    v = did_not_end(s.events, 600, 120, "RUNNING")
    assert v.diagnosis == "run did not finish" and "within 600 s" in v.message and "rank 0 at step 20" in v.message
    s.events.append(s._e("recorder", "run_finished", state="FINISHED"))
    v = did_not_end(s.events, 600, 120, "RUNNING")
    assert v.diagnosis == "driver did not exit", v
    # the driver's own window is what was waited after Train's run ended, not the finish timeout
    assert v.message.startswith("driver did not exit: Train's run ended FINISHED, but 120 s later its job was still "
                                "RUNNING")


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


def windowed(every, window_checkpoint):
    """Checkpoints every ``every`` steps (None: none) up to step 12, the notice, steps 13..16
    with a checkpoint at ``window_checkpoint``, the node gone, the restart."""
    s = Script().start_attempt().steps(1, 12, every=every).preemption(window_s=8.0)
    for step in range(13, 17):
        s.report({0: step, 1: step}, f"/storage/checkpoint_{step}" if step == window_checkpoint else None)
    return s.gone().decision(budget_class="preemption").start_attempt().steps(window_checkpoint + 1, 20,
                                                                              every=None).finish().timeline()


def test_a_periodic_checkpoint_that_lands_in_the_window_is_no_just_in_time_checkpoint():
    [v] = preemption_window(windowed(5, 15), Expect(checkpoint_in_window=True))
    assert v.status == "fail" and v.diagnosis == "no just-in-time checkpoint", v.line()
    assert "step 15 falls on the script's periodic cadence (every 5 steps from 10)" in v.message
    # the twin: off the cadence, made because of the notice
    [v] = preemption_window(windowed(5, 13), Expect(checkpoint_in_window=True))
    assert v.status == "pass" and "off the periodic cadence (every 5 steps from 10)" in v.message, v.line()


def test_a_window_checkpoint_with_no_cadence_before_the_notice_is_unverifiable():
    [v] = preemption_window(windowed(None, 14), Expect(checkpoint_in_window=True))
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no checkpoint cadence", v.line()


def two_preemptions(second_checkpoint_step):
    """Checkpoints every 5 steps; preemption 1 gets a just-in-time checkpoint at 17 (off the
    cadence); preemption 2's window holds a checkpoint at ``second_checkpoint_step``."""
    s = Script().start_attempt().steps(1, 16, every=5).preemption(window_s=8.0)
    s.report({0: 17, 1: 17}, "/storage/checkpoint_17")
    s.gone().decision(budget_class="preemption").start_attempt().steps(18, 19, every=None)
    s.preemption(node_id="n0", window_s=8.0)
    step = second_checkpoint_step
    s.report({0: step, 1: step}, f"/storage/checkpoint_{step}").report({0: step + 1, 1: step + 1})
    s.gone(node_id="n0").decision(budget_class="preemption").start_attempt()
    return s.steps(step + 1, step + 5, every=None).finish().timeline()


def test_an_earlier_preemptions_just_in_time_checkpoint_does_not_shift_the_cadence():
    # step 20 is the periodic checkpoint (every 5): anchored on preemption 1's just-in-time 17
    # it looked off the cadence and passed as preemption 2's just-in-time checkpoint
    first, second = preemption_window(two_preemptions(20), Expect(checkpoint_in_window=True))
    assert first.status == "pass", first.line()
    assert second.status == "fail" and second.diagnosis == "no just-in-time checkpoint", second.line()
    assert "(every 5 steps from 15)" in second.message and second.evidence["periodic_checkpoint_steps"] == [5, 10, 15]
    # twin: preemption 2's checkpoint at 21 is off the cadence, made for the notice
    first, second = preemption_window(two_preemptions(21), Expect(checkpoint_in_window=True))
    assert second.status == "pass" and "off the periodic cadence (every 5 steps from 15)" in second.message, \
        second.line()


def persisted_early(before_notice: bool):
    """Checkpoints every 10 steps; rank 0 persists an off-cadence checkpoint at step 13 (a
    report Ray commits only once rank 1 reports it too) before or after the notice; the
    commit lands inside the window either way."""
    s = Script().start_attempt().steps(1, 12, every=10)
    if before_notice:
        s.persist("/storage/checkpoint_13", 13).preemption(window_s=8.0)
    else:
        s.preemption(window_s=8.0).persist("/storage/checkpoint_13", 13)
    s.report({0: 13, 1: 13}, "/storage/checkpoint_13", persisted=False).report({0: 14, 1: 14})
    return s.gone().decision(budget_class="preemption").start_attempt().steps(14, 20, every=None).finish().timeline()


def test_a_checkpoint_persisted_before_the_notice_and_committed_after_it_is_no_just_in_time_checkpoint():
    [v] = preemption_window(persisted_early(before_notice=True), Expect(checkpoint_in_window=True))
    assert v.status == "fail" and v.diagnosis == "no just-in-time checkpoint", v.line()
    assert "the checkpoint at step 13 was already on storage 0.5 s before the notice" in v.message
    assert v.evidence["persisted_before_notice"] == [13]
    # the twin: persisted after the notice, off the cadence: made because of it
    [v] = preemption_window(persisted_early(before_notice=False), Expect(checkpoint_in_window=True))
    assert v.status == "pass" and "off the periodic cadence" in v.message, v.line()


def test_a_checkpoint_persisted_after_the_notice_passes_even_when_train_reports_the_notice_later():
    # Train's watcher passes the notice on, and the controller sees a rank's echo of it, after the
    # harness's notice — often in the same poll as the rank's just-in-time checkpoint: the notice
    # itself is the line, so a healthy just-in-time checkpoint is not failed for that order
    s = Script().start_attempt().steps(1, 12, every=10).preemption(window_s=8.0).persist("/storage/checkpoint_13", 13)
    s.events.append(s._e("recorder", "train_preemption_notice", 0.0, attempt=s.attempt, preempted_ranks=[1]))
    s.report({0: 13, 1: 13}, "/storage/checkpoint_13", persisted=False).report({0: 14, 1: 14})
    tl = s.gone().decision(budget_class="preemption").start_attempt().steps(14, 20, every=None).finish().timeline()
    [v] = preemption_window(tl, Expect(checkpoint_in_window=True))
    assert v.status == "pass", v.line()


def test_a_window_checkpoint_nobody_was_seen_persisting_is_unverifiable():
    s = Script().start_attempt().steps(1, 12, every=10).preemption(window_s=8.0)
    s.report({0: 13, 1: 13}, "/storage/checkpoint_13", persisted=False)
    tl = s.gone().decision(budget_class="preemption").start_attempt().steps(14, 20, every=None).finish().timeline()
    [v] = preemption_window(tl, Expect(checkpoint_in_window=True))
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no persist record", v.line()


# -- determinism: a state value that does not reproduce fails only a declared-deterministic workload --
def test_a_state_that_does_not_reproduce_is_a_warning_unless_the_workload_is_deterministic():
    tl = (Script(state_metric="loss").start_attempt().steps(1, 12, state=loss).fault().decision()
          .start_attempt().steps(11, 20, state=lambda r, s: loss(r, s) * 1.5).finish().timeline())
    [v] = state_restored(tl, Expect(deterministic=False))
    assert v.status == "warning" and v.diagnosis == "state differs", v.line()
    assert "a warning, not a failure" in v.message and "--chaos-deterministic" in v.message
    assert not v.fails() and not v.fails("fail")
    check([v])  # a warning never fails the test
    [v] = state_restored(tl, DET)
    assert v.status == "fail" and v.diagnosis == "state not restored"
    # through verdicts_for, the expectation decides
    assert [x.status for x in judge(tl, Expect(charged={"worker_group": 1}, deterministic=False))
            if x.name.startswith("state-restored")] == ["warning"]


def test_at_the_checkpoint_step_a_next_step_that_does_not_reproduce_warns_for_a_nondeterministic_script():
    tl = evaluated_or_retrained(12, 11, every_after=None, state_after=lambda r, s: train_loss(r, s) * 1.1)
    [v] = resumed_from_latest(tl, Expect(deterministic=False))
    assert v.status == "warning" and v.diagnosis == "state differs", v.line()
    assert "began at the checkpoint's own step 10" in v.message and "not declared deterministic" in v.message
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "fail" and v.diagnosis == "state not restored"


def test_a_refused_state_metric_is_unverifiable_naming_what_was_reported():
    s = Script(state_metric="auto").start_attempt().steps(1, 12).fault().decision().start_attempt().steps(11, 20)
    for e in s.events:
        if e.kind == "report" and e.data["steps"]["0"] == 3:
            e.data["state_refused"] = {"0": "loss = 'nan' (str)"}
    [v] = state_restored(s.finish().timeline(), DET)
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no state metric", v.line()
    assert "rank 0 reported loss = 'nan' (str), not a number" in v.message


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

"""Issue 44's sixteen reporting shapes real scripts have, each buggy case beside its healthy
twin: what the verdicts got wrong before chaos.verdicts (6 false passes, 8 false failures, 2
misleading messages) and what they must give.  Timelines as the recorder and the faults make
them (timelines.Script), or the recorder's own logic fed hook facts (timelines.Recorded)."""

import dataclasses
import math

from chaos.train.run import continuation
from chaos.verdicts import Baseline, Diagnosis, Expect, judge
from chaos.verdicts.budget import within_budget
from chaos.verdicts.resume import resumed_from_latest
from chaos.verdicts.state import state_restored
from chaos.verdicts.trajectory import state_trajectory
from timelines import Recorded, Script

DET = Expect(deterministic=True)


def f(k):
    """The loss of a step that began from the state after ``k`` steps: a step's loss is
    computed before its update, so it shows the state the step began from."""
    return 10.0 / (k + 1)


def resume(tl, expect=DET):
    [v] = resumed_from_latest(tl, expect)
    return v


def restored(tl, expect=DET):
    [v] = state_restored(tl, expect)
    return v


# -- 1: the checkpoint reported before the step's metrics (false pass, and its false failure) ---
def checkpoint_before_metrics(restart_at):
    """Every 5th step the loop trains, saves, reports ``report({}, checkpoint=ck)`` and then
    ``report({"step": s, "loss": ...})``: checkpoint 10 holds the state after step 10.  The
    restart loads it and begins at ``restart_at`` (10: step 10 trained twice; 11: right)."""
    run = Recorded().start_attempt()
    for s in range(1, 13):
        if s % 5 == 0:
            run.report({}, f"/storage/ck{s}")
        run.report({"step": s, "loss": f(s - 1)})
    run.fault().start_attempt()
    for k, s in enumerate(range(restart_at, 21), start=10):
        run.report({"step": s, "loss": f(k)})
    return run.finish().timeline()


def test_1_a_checkpoint_reported_before_its_steps_metrics_then_that_step_trained_again_fails():
    v = resume(checkpoint_before_metrics(10))
    assert v.status == "fail" and v.diagnosis is Diagnosis.TRAINED_AGAIN, v.line()
    assert "step 10 was trained again from the state after it" in v.message, v.line()


def test_1_twin_the_same_order_resumed_at_the_next_step_passes():
    v = resume(checkpoint_before_metrics(11))
    assert v.status == "pass" and "step 11 reproduced" in v.message, v.line()


def test_1_the_recorder_gives_a_step_less_checkpoint_no_step_of_its_own():
    report = next(e for e in checkpoint_before_metrics(11).of("report") if e.data["checkpoint"])
    assert report.data["steps"] == {"0": None, "1": None}, report.data
    assert report.data["checkpoint_after_step"] == {"0": 4, "1": 4}, report.data
    # without a state value nothing tells the two readings apart: unverifiable, never a pass
    run = Recorded(state_metric=None).start_attempt()
    for s in range(1, 13):
        if s % 5 == 0:
            run.report({}, f"/storage/ck{s}")
        run.report({"step": s})
    run.fault().start_attempt()
    for s in range(10, 21):
        run.report({"step": s})
    v = resume(run.finish().timeline())
    assert v.status == "unverifiable" and v.diagnosis is Diagnosis.CHECKPOINT_STEP_AMBIGUOUS, v.line()


# -- 2: saved at the top of the step (false pass, and its false failure) ---------------------------
def saved_at_the_top(restart_at, deterministic=True):
    """Every 5th step the loop saves the state *before* training step s, labelled s
    (``report({"step": s}, checkpoint=ck)``), then trains s and reports its loss.  The
    restart loads checkpoint 10 (the state after 9) and begins at ``restart_at``; a restart at
    10 saves the loaded state again at the top of step 10, as the loop does."""
    s_ = Script(state_metric="loss").start_attempt()
    for s in range(1, 13):
        if s % 5 == 0:
            s_.report({0: s, 1: s}, f"/storage/ck{s}")
        s_.report({0: s, 1: s}, states={0: f(s - 1), 1: f(s - 1)})
    s_.fault().decision().start_attempt()
    for k, s in enumerate(range(restart_at, 21), start=9):
        if s % 5 == 0:
            s_.report({0: s, 1: s}, f"/storage/ck{s}-again")
        s_.report({0: s, 1: s}, states={0: f(k), 1: f(k)})
    return s_.finish().timeline()


def test_2_a_restart_past_a_checkpoint_saved_at_the_top_of_its_step_fails_as_skipped_data():
    v = resume(saved_at_the_top(11))
    assert v.status == "fail" and v.diagnosis is Diagnosis.PAST_THE_CHECKPOINT, v.line()
    assert "saved at the top of step 10" in v.message, v.line()
    # not declared deterministic: the value cannot decide, and it is never a pass
    v = resume(saved_at_the_top(11), Expect())
    assert v.status == "unverifiable" and v.diagnosis is Diagnosis.CHECKPOINT_STEP_AMBIGUOUS, v.line()


def test_2_twin_a_restart_at_that_step_saving_the_loaded_state_again_passes():
    v = resume(saved_at_the_top(10))
    assert v.status == "pass" and "step 10 reproduced" in v.message, v.line()


def saved_at_the_top_then_killed_on_it(restart_at):
    """The same habit (checkpoints 5 and 10 saved at the top of their steps), and the fault
    right after checkpoint 15's report, before step 15 itself is reported: only the habit says
    that checkpoint may hold the state before step 15."""
    s_ = Script(state_metric="loss").start_attempt()
    for s in range(1, 16):
        if s % 5 == 0:
            s_.report({0: s, 1: s}, f"/storage/ck{s}")
        if s < 15:
            s_.report({0: s, 1: s}, states={0: f(s - 1), 1: f(s - 1)})
    s_.fault().decision().start_attempt()
    for k, s in enumerate(range(restart_at, 21), start=14):
        if s % 5 == 0:
            s_.report({0: s, 1: s}, f"/storage/ck{s}-again")
        s_.report({0: s, 1: s}, states={0: f(k), 1: f(k)})
    return s_.finish().timeline()


FAULT_FREE_20 = Baseline("k", trajectory={r: [[st, {"loss": f(st - 1)}] for st in range(1, 21)] for r in (0, 1)},
                         job_id="b1", made_at="then")


def test_2_killed_right_after_a_top_of_step_checkpoint_the_habit_keeps_both_readings():
    # the healthy restart at 15 saves 15 again: no longer "resumed from an older checkpoint"
    v = resume(saved_at_the_top_then_killed_on_it(15))
    assert v.status == "unverifiable" and v.diagnosis is Diagnosis.CHECKPOINT_STEP_AMBIGUOUS, v.line()
    with_baseline = dataclasses.replace(DET, baseline=True, reference=FAULT_FREE_20)
    assert resume(saved_at_the_top_then_killed_on_it(15), with_baseline).status == "pass"
    v = resume(saved_at_the_top_then_killed_on_it(16), with_baseline)  # its twin skips step 15
    assert v.status == "fail" and v.diagnosis is Diagnosis.PAST_THE_CHECKPOINT, v.line()


# -- 3: two faults charged each other's budget classes (false pass) -------------------------------
def two_faults(first_class, second_class):
    s = Script().start_attempt().steps(1, 12)
    s.fault(kind="raylet-kill").decision(budget_class=first_class, limit=3)
    s.start_attempt().steps(11, 16).preemption().gone()
    s.decision(budget_class=second_class, limit=3, error_types=("WorkerGroupError", "PreemptionError"))
    return s.start_attempt().steps(16, 20).finish().timeline()


TWO = Expect(charged={"worker_group": 1, "preemption": 1})


def test_3_two_faults_charged_each_others_class_fail_though_the_totals_match():
    v = within_budget(two_faults("preemption", "worker_group"), TWO)
    assert v.status == "fail" and v.diagnosis is Diagnosis.WRONG_BUDGET_CLASS, v.line()
    assert "the raylet-kill fault's failure (attempt 0) was charged to max_preemption_failures" in v.message
    assert "the preempt fault's failure (attempt 1) was charged to max_failures" in v.message


def test_3_twin_each_fault_charged_to_its_own_class_passes():
    v = within_budget(two_faults("worker_group", "preemption"), TWO)
    assert v.status == "pass", v.line()
    # a profile that moves a kind's charge (expected_budget) moves it for this rule too
    moved = dataclasses.replace(TWO, charge_by_kind={"raylet-kill": "preemption", "preempt": "worker_group"})
    assert within_budget(two_faults("preemption", "worker_group"), moved).status == "pass"
    # a suite whose own totals differ from what its kinds imply claims no class per fault (the fixture maps them to None)
    unclaimed = dataclasses.replace(TWO, charge_by_kind={"raylet-kill": None, "preempt": None})
    assert within_budget(two_faults("preemption", "worker_group"), unclaimed).status == "pass"


# -- 4: a CUDA fault credited with another node's actor death (false pass) -------------------------
def cuda_fault_then(errors):
    s = Script().start_attempt().steps(1, 12).rank_fault("cuda", rank=1)
    s.events[-1].data["detect_by"] = "train"  # what the experiment records for a fault that leaves its node up
    s.worker_error(errors).decision()
    return s.start_attempt().steps(11, 20).finish().timeline()


def test_4_a_cuda_fault_is_not_credited_with_another_nodes_actor_death():
    v = within_budget(cuda_fault_then({0: "ActorDiedError: the actor died unexpectedly"}),
                      Expect(charged={"worker_group": 1}))
    assert v.status == "fail" and v.diagnosis is Diagnosis.UNRELATED_FAILURE, v.line()
    assert "the cuda fault takes no node away" in v.message, v.line()


def test_4_twin_the_faulted_ranks_own_cuda_error_is_its_charge():
    v = within_budget(cuda_fault_then({1: "RuntimeError: CUDA error: uncorrectable ECC error encountered"}),
                      Expect(charged={"worker_group": 1}))
    assert v.status == "pass", v.line()
    # its own process dying of it (an ActorDiedError of rank 1, on its node) is the fault's too
    v = within_budget(cuda_fault_then({1: "ActorDiedError: the actor died"}), Expect(charged={"worker_group": 1}))
    assert v.status == "pass", v.line()


# -- 5: a float step (epoch progress) (false n/a) ---------------------------------------------------
def epoch_progress(restored_state):
    """Steps as epoch progress: attempt 0 adds 0.1 a step (1.0999999999999999 at the 11th),
    the restart computes step/10 (1.1); a checkpoint at the 7th, the fault after the 11th."""
    s = Script(state_metric="loss").start_attempt()
    epoch = 0.0
    for i in range(1, 12):
        epoch += 0.1
        s.report({0: epoch, 1: epoch}, "/storage/ck7" if i == 7 else None, states={0: f(i - 1), 1: f(i - 1)})
    s.fault().decision().start_attempt()
    k = 1.0 if restored_state else 1.5
    for i in range(8, 21):
        s.report({0: i / 10, 1: i / 10}, states={0: f(i - 1) * k, 1: f(i - 1) * k})
    return s.finish().timeline()


def test_5_a_float_step_whose_state_was_not_restored_fails():
    v = restored(epoch_progress(False))
    assert v.status == "fail" and v.diagnosis is Diagnosis.STATE_NOT_RESTORED, v.line()


def test_5_twin_a_float_step_restored_passes():
    v = restored(epoch_progress(True))
    assert v.status == "pass" and len(v.evidence["compared"]) == 8, v.line()


# -- 6: a fault right after a checkpoint, one step re-done (false pass) -----------------------------
def after_a_checkpoint(fresh_optimizer):
    """Checkpoint at step 10, step 11 reported, the fault; the restart re-does only step 11,
    whose loss (computed before any update) shows the weights alone.  A fresh optimizer shows
    from step 12 on, which no earlier attempt reported."""
    s = Script(state_metric="loss").start_attempt()
    for st in range(1, 12):
        s.report({0: st, 1: st}, f"/storage/ck{st}" if st % 5 == 0 else None, states={0: f(st - 1), 1: f(st - 1)})
    s.fault().decision().start_attempt()
    for st in range(11, 21):
        off = 1.3 if fresh_optimizer and st > 11 else 1.0
        s.report({0: st, 1: st}, f"/storage/ck{st}" if st % 5 == 0 else None,
                 states={0: f(st - 1) * off, 1: f(st - 1) * off})
    return s.finish().timeline()


FAULT_FREE = Baseline("k", trajectory={r: [[st, {"loss": f(st - 1)}] for st in range(1, 21)] for r in (0, 1)},
                      final={r: {"step": 20, "state": {"loss": f(19)}} for r in (0, 1)}, job_id="b1", made_at="then")


def test_6_one_re_done_step_is_no_proof_of_a_deterministic_runs_state():
    verdicts = judge(after_a_checkpoint(True), dataclasses.replace(DET, charged={"worker_group": 1}))
    state = [v for v in verdicts if v.name.startswith("state-")]
    assert [v.status for v in state] == ["unverifiable"], [v.line() for v in verdicts]
    assert state[0].diagnosis is Diagnosis.TOO_FEW_REDONE and "--chaos-baseline" in state[0].message
    # with the fault-free baseline (what the experiment makes then), the lost optimizer fails
    with_baseline = dataclasses.replace(DET, baseline=True, reference=FAULT_FREE)
    [trajectory] = [v for v in judge(after_a_checkpoint(True), with_baseline) if v.name == "state-trajectory"]
    assert trajectory.status == "fail" and "step 12" in trajectory.message, trajectory.line()


def test_6_twin_a_whole_restore_follows_the_baseline_and_a_non_deterministic_run_is_not_asked():
    with_baseline = dataclasses.replace(DET, baseline=True, reference=FAULT_FREE)
    verdicts = judge(after_a_checkpoint(False), with_baseline)
    assert {v.name: v.status for v in verdicts if v.name.startswith("state-")} == {
        "state-restored (attempt 1)": "n/a", "state-trajectory": "pass"}, [v.line() for v in verdicts]
    assert state_trajectory(after_a_checkpoint(False), FAULT_FREE, DET).status == "pass"
    assert restored(after_a_checkpoint(True), Expect()).status == "pass"  # not deterministic: nothing asked


# -- 7: Hugging Face Trainer, logging_steps=10, save_steps=25 (false failure) -----------------------
def logged_and_saved_apart(resumed):
    """Ray's callback reports the last *logged* step with each checkpoint: 20, 50, 70, 100."""
    s = Script().start_attempt()
    for st in (20, 50, 70, 100):
        s.report({0: st, 1: st}, f"/storage/checkpoint-{st}")
    s.fault().decision().start_attempt()
    for st in resumed:
        s.report({0: st, 1: st}, f"/storage/checkpoint-{st}-again")
    return s.finish().timeline()


def test_7_varying_strides_cannot_predict_the_next_step_so_a_correct_resume_is_unverifiable_not_failed():
    v = resume(logged_and_saved_apart((120, 150, 170, 200)))
    assert v.status == "unverifiable" and v.diagnosis is Diagnosis.IRREGULAR_STRIDE, v.line()
    assert "varying strides (30, 20)" in v.message, v.line()


def test_7_twin_a_restart_from_scratch_still_fails():
    v = resume(logged_and_saved_apart((20, 50, 70)))
    assert v.status == "fail" and v.diagnosis is Diagnosis.RESTARTED_FROM_SCRATCH, v.line()


# -- 8: reports every 3rd iteration of the current attempt (false failure) --------------------------
def every_third_of_the_attempt(first):
    s = Script().start_attempt()
    for st in (1, 4, 7, 10, 13):
        s.report({0: st, 1: st}, "/storage/ck10" if st == 10 else None)
    s.fault().decision().start_attempt()
    for st in range(first, 25, 3):
        s.report({0: st, 1: st}, f"/storage/ck{st}" if st % 5 == 0 else None)
    return s.finish().timeline()


def test_8_a_reporting_phase_that_restarts_with_the_attempt_is_judged_by_the_step_after_the_checkpoint():
    v = resume(every_third_of_the_attempt(11))
    assert v.status == "pass" and "step 11 is the one right after checkpoint step 10" in v.message, v.line()
    v = resume(every_third_of_the_attempt(12))  # 11 unreported or skipped: nothing tells
    assert v.status == "unverifiable" and v.diagnosis is Diagnosis.BETWEEN_REPORTS, v.line()


def test_8_twin_a_restart_from_scratch_still_fails():
    v = resume(every_third_of_the_attempt(1))
    assert v.status == "fail" and v.diagnosis is Diagnosis.RESTARTED_FROM_SCRATCH, v.line()


# -- 9: the first attempt never reported a step (false failure) -------------------------------------
def first_attempt_without_a_step(start):
    s = Script().start_attempt()
    s.report({0: None, 1: None}, metrics={"warmup": 1.0})
    s.fault().decision().start_attempt()
    return s.steps(start, 20).finish().timeline()


def test_9_a_fresh_start_after_an_attempt_that_reported_no_step_passes():
    v = resume(first_attempt_without_a_step(1))
    assert v.status == "pass" and v.message.startswith("no checkpoint existed yet"), v.line()


def test_9_twin_a_run_that_never_reports_a_step_stays_unverifiable():
    s = Script().start_attempt().report({0: None, 1: None}).fault().decision().start_attempt()
    v = resume(s.report({0: None, 1: None}, "/storage/ck").finish().timeline())
    assert v.status == "unverifiable" and v.diagnosis is Diagnosis.NO_STEP_METRIC, v.line()


# -- 10: an elastic run (false unverifiable) --------------------------------------------------------
def elastic(new_ranks_begin_at):
    """num_workers=(2, 4): 4 ranks, 2 after the fault (checkpoint 15 by ranks 0 and 1 alone),
    4 again after the resize; ranks 2 and 3 of attempt 2 begin at ``new_ranks_begin_at``."""
    s = Script(ranks=4).start_attempt().steps(1, 12).fault().decision()
    s.ranks = 2
    s.start_attempt().steps(11, 17)
    s.events.append(s._e("recorder", "state_changed", prev="RUNNING", cur="RESIZING"))
    s.ranks = 4
    s.start_attempt()
    for st in range(16, 26):
        s.report({r: (st if r < 2 else st - 16 + new_ranks_begin_at) for r in range(4)},
                 f"/storage/ck{st}" if st % 5 == 0 else None)
    return s.finish().timeline()


def test_10_ranks_new_to_an_elastic_run_are_judged_against_the_checkpoint():
    first, second = resumed_from_latest(elastic(16), DET)
    assert (first.status, second.status) == ("pass", "pass"), (first.line(), second.line())
    assert "without rank 2, which did not run in attempt 1 (the world size changed)" in \
        second.evidence["ranks"][2]["rule"], second.evidence["ranks"][2]


def test_10_twin_new_ranks_that_start_over_fail():
    first, second = resumed_from_latest(elastic(1), DET)
    assert second.status == "fail" and second.diagnosis is Diagnosis.RESTARTED_FROM_SCRATCH, second.line()
    assert "rank 2 began attempt 2 at step 1" in second.message, second.line()


# -- 11: the suite's tolerance in the resume rule (false failure) -----------------------------------
def evaluated_then(off):
    """An evaluation after loading checkpoint 10, then steps 11.. ``off`` away from attempt 0's."""
    s = Script(state_metric="loss").start_attempt()
    for st in range(1, 13):
        s.report({0: st, 1: st}, f"/storage/ck{st}" if st % 5 == 0 else None, states={0: f(st - 1), 1: f(st - 1)})
    s.fault().decision().start_attempt().report({0: 10, 1: 10}, states={0: 99.0, 1: 99.0})
    for st in range(11, 21):
        s.report({0: st, 1: st}, states={0: f(st - 1) * off, 1: f(st - 1) * off})
    return s.finish().timeline()


def test_11_a_difference_the_suites_tolerance_allows_passes_the_resume_rule_as_it_does_the_state_rule():
    loose = dataclasses.replace(DET, state_rtol=1e-2)
    v = resume(evaluated_then(1.001), loose)
    assert v.status == "pass" and "evaluating after loading it" in v.message, v.line()
    assert restored(evaluated_then(1.001), loose).status == "pass"


def test_11_twin_beyond_the_tolerance_both_fail():
    loose = dataclasses.replace(DET, state_rtol=1e-2)
    assert resume(evaluated_then(1.05), loose).diagnosis is Diagnosis.STATE_NOT_RESTORED
    assert restored(evaluated_then(1.05), loose).diagnosis is Diagnosis.STATE_NOT_RESTORED
    assert resume(evaluated_then(1.001)).status == "fail"  # the default rtol 1e-4 does not allow 0.1 %


# -- 12: one NaN loss far from the fault (false unverifiable) ---------------------------------------
def nan_at_step_3(restored_state):
    run = Recorded().start_attempt()
    for s in range(1, 13):
        run.report({"step": s, "loss": math.nan if s == 3 else f(s - 1)}, f"/storage/ck{s}" if s % 5 == 0 else None)
    run.fault().start_attempt()
    for s in range(11, 21):
        run.report({"step": s, "loss": f(s - 1) * (1 if restored_state else 1.5)})
    return run.finish().timeline()


def test_12_a_nan_loss_far_from_the_fault_does_not_hide_a_restore_bug():
    v = restored(nan_at_step_3(False))
    assert v.status == "fail" and v.diagnosis is Diagnosis.STATE_NOT_RESTORED, v.line()
    assert v.evidence["not_finite"] == ["rank 0: nan", "rank 1: nan"], v.evidence


def test_12_twin_a_nan_loss_in_a_healthy_run_passes():
    v = restored(nan_at_step_3(True))
    assert v.status == "pass", v.line()


# -- 13: the step as a string (misleading unverifiable) ---------------------------------------------
def string_steps(spell):
    run = Recorded(state_metric=None).start_attempt()
    for s in range(1, 13):
        run.report({"step": spell(s)}, f"/storage/ck{s}" if s % 5 == 0 else None)
    run.fault().start_attempt()
    for s in range(11, 21):
        run.report({"step": spell(s)})
    return run.finish().timeline()


def test_13_a_step_that_is_no_number_says_it_was_a_string():
    v = resume(string_steps(lambda s: f"s{s}"))
    assert v.status == "unverifiable" and v.diagnosis is Diagnosis.STEP_NOT_A_NUMBER, v.line()
    assert "'s1' (str)" in v.message and "--chaos-step-metric" not in v.message, v.line()


def test_13_twin_a_step_spelt_as_a_number_is_read():
    v = resume(string_steps(str))
    assert v.status == "pass" and "resumed at step 11" in v.message, v.line()


# -- 14: rank-0-only metrics (decided: unverifiable, naming the shape and the fix) ------------------
def rank0_only_steps():
    s = Script().start_attempt().steps(1, 12, rank_step=lambda r, st: st if r == 0 else None)
    s.fault().decision().start_attempt().steps(11, 20, rank_step=lambda r, st: st if r == 0 else None)
    return s.finish().timeline()


def test_14_ranks_that_never_report_a_step_are_unverifiable_naming_the_shape_and_the_fix():
    v = resume(rank0_only_steps())
    assert v.status == "unverifiable" and v.diagnosis is Diagnosis.RANK_NEVER_REPORTS_A_STEP, v.line()
    assert "no step in any attempt (rank-0-only metrics?)" in v.message, v.line()
    assert "report the step on every rank" in v.message, v.line()


def test_14_twin_every_rank_reporting_its_step_passes():
    v = resume(Script().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(11, 20).finish()
               .timeline())
    assert v.status == "pass", v.line()


# -- 15: what a lost data position shows (misleading message) ---------------------------------------
def restarted_with(first_redone, later):
    """Attempt 0 to step 13, the restart at 11: its first re-done step's loss times
    ``first_redone``, the later ones' times ``later``."""
    s = Script(state_metric="loss").start_attempt()
    for st in range(1, 14):
        s.report({0: st, 1: st}, f"/storage/ck{st}" if st % 5 == 0 else None, states={0: f(st - 1), 1: f(st - 1)})
    s.fault().decision().start_attempt()
    for st in range(11, 21):
        k = first_redone if st == 11 else later
        s.report({0: st, 1: st}, states={0: f(st - 1) * k, 1: f(st - 1) * k})
    return s.finish().timeline()


def test_15_weights_right_and_the_steps_after_wrong_says_so_and_blames_no_model_state():
    v = restored(restarted_with(1.0, 1.2))
    assert v.status == "fail" and v.diagnosis is Diagnosis.STATE_NOT_RESTORED, v.line()
    assert "the first re-done step (11) reproduced, so the weights and its batch were right" in v.message, v.line()
    assert "optimizer" in v.message and "data position" in v.message and "model state was not" not in v.message


def test_15_twin_a_first_re_done_step_that_differs_points_at_the_state_it_began_from():
    v = restored(restarted_with(1.2, 1.2))
    assert v.status == "fail" and "re-done step 11" in v.message, v.line()
    assert "the state the restart began from differs — the weights, or the batch" in v.message, v.line()


# -- 16: a resubmission under a new run name (misleading message) -----------------------------------
def resubmitted_as(name):
    """A head fault's resubmission whose driver names its Train run ``name`` (the lost one was
    train-20240101-0000), joined to the lost run as the harness does (continuation)."""
    s = Script().start_attempt().steps(1, 12)
    lost = s.timeline()
    for e in lost.events:
        if e.kind == "controller_started":
            e.data.update(run_name="train-20240101-0000", storage_path="/storage")
    t = s.t + 0.2
    lost.emit("fault", "fault_injected", t=t, fault="gcs-kill", ledger_id="h1", target={"node_id": "head"})
    lost.emit("fault", "fault_detected", t=t + 0.3, ledger_id="h1", by="head_unreachable")
    lost.emit("harness", "job_abandoned", t=t + 12.0, job_id="job-1", why="gcs-kill")
    join = continuation(lost)
    again = Script()
    again.t = t + 20.0
    again.events.clear()
    again.new_run("run2").start_attempt().steps(1, 20).finish()
    for e in again.events:
        if e.kind == "controller_started":
            e.data.update(run_name=name, storage_path="/storage")
        lost.add(join(e))
    return lost


def test_16_a_resubmission_that_started_a_new_run_names_both_runs_and_the_fix():
    v = resume(resubmitted_as("train-20240101-0005"))
    assert v.status == "fail" and v.diagnosis is Diagnosis.RESTARTED_FROM_SCRATCH, v.line()
    assert "started Train run 'train-20240101-0005'" in v.message and "'train-20240101-0000'" in v.message
    assert "a name that is stable across job retries" in v.message, v.line()


def test_16_twin_a_resubmission_under_the_same_name_is_a_plain_restart_from_scratch():
    v = resume(resubmitted_as("train-20240101-0000"))
    assert v.status == "fail" and v.diagnosis is Diagnosis.RESTARTED_FROM_SCRATCH, v.line()
    assert "stable across job retries" not in v.message, v.line()


def digests_after_a_checkpoint(lost_part=None):
    """The reference workload's reports: ``digest_<part>`` of the state each step began from,
    and with checkpoint 10 ``saved_digest_<part>`` of the state it saved; the fault right after
    the checkpoint, so the restart re-does no step; ``lost_part`` did not come back."""
    parts = ("data", "rng", "scheduler", "optimizer", "weights")

    def began(step, lost=None):
        return {f"digest_{p}": f"{p}@{step - 1}" + ("!" if p == lost else "") for p in parts}

    s = Script(state_metric="loss").start_attempt()
    for st in range(1, 11):
        saved = {f"saved_digest_{p}": f"{p}@{st}" for p in parts} if st == 10 else {}
        s.report({0: st, 1: st}, "/storage/ck10" if st == 10 else None, states={0: f(st - 1), 1: f(st - 1)},
                 metrics={**began(st), **saved})
    s.fault().decision().start_attempt()
    for st in range(11, 21):
        s.report({0: st, 1: st}, states={0: f(st - 1), 1: f(st - 1)}, metrics=began(st, lost_part if st == 11 else None))
    return s.finish().timeline()


def test_6_a_part_lost_with_no_step_re_done_fails_against_the_checkpoints_saved_digests():
    v = restored(digests_after_a_checkpoint("optimizer"))
    assert v.status == "fail" and v.diagnosis is Diagnosis.STATE_NOT_RESTORED, v.line()
    assert "began step 11 in attempt 1 from another state than checkpoint step 10 saved" in v.message, v.line()
    assert "the optimizer's state (momentum, ...) was not restored (digest_optimizer differs)" in v.message


def test_6_twin_the_whole_state_shown_against_the_checkpoint_needs_no_baseline():
    v = restored(digests_after_a_checkpoint())
    assert v.status == "pass" and "step 11 began from the state checkpoint step 10 saved" in v.message, v.line()

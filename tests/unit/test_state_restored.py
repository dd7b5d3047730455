"""state-restored: re-done steps reproduce the earlier attempt's state, on recorded timelines."""

import dataclasses

from chaos.verdicts import Diagnosis, Expect, check, judge
from chaos.verdicts.state import state_restored
from timelines import Script, evaluated_or_retrained, good_run, loss, train_loss

DET = Expect(deterministic=True)


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


def test_a_refused_state_metric_is_unverifiable_naming_what_was_reported():
    s = Script(state_metric="auto").start_attempt().steps(1, 12).fault().decision().start_attempt().steps(11, 20)
    for e in s.events:
        if e.kind == "report" and e.data["steps"]["0"] == 3:
            e.data["state_refused"] = {"0": "loss = 'nan' (str)"}
    [v] = state_restored(s.finish().timeline(), DET)
    assert v.status == "unverifiable" and v.diagnosis == "unverifiable: no state metric", v.line()
    assert "rank 0 reported loss = 'nan' (str), not a number" in v.message


# -- a state metric that does not move shows no state ------------------------------------------------
def redone_with(value, restored=True):
    """Steps 1..12 (checkpoints at 5 and 10), the fault, steps 11..20 re-done from checkpoint
    10 — or, ``restored=False``, from the weights' initial state — each reporting ``value(s)``
    of the state step s began from."""
    s = Script(state_metric="loss").start_attempt().steps(1, 12, state=lambda r, st: value(st - 1)).fault().decision()
    return s.start_attempt().steps(11, 20, state=lambda r, st: value(st - 1 if restored else st - 11)).finish()


def test_re_done_steps_that_reproduce_a_state_metric_that_does_not_move_show_nothing():
    # a constant "loss" (a metric that does not move with training): the weights were not
    # restored, and every re-done step still reproduces it
    tl = redone_with(lambda k: 1.0, restored=False).timeline()
    [v] = state_restored(tl, DET)
    assert v.status == "unverifiable" and v.diagnosis is Diagnosis.STATE_DOES_NOT_TELL, v.line()
    [v] = state_restored(tl, Expect())  # not declared deterministic: said, not a pass
    assert v.status == "n/a" and "did not move beyond the tolerance" in v.message, v.line()
    # a loss that moves 0.1 % a step under a 1 % tolerance: the same
    slow = redone_with(lambda k: 1.0 - 0.001 * k).timeline()
    [v] = state_restored(slow, dataclasses.replace(DET, state_rtol=1e-2))
    assert v.status == "unverifiable" and v.diagnosis is Diagnosis.STATE_DOES_NOT_TELL, v.line()


def test_re_done_steps_that_reproduce_a_moving_state_metric_pass():
    [v] = state_restored(redone_with(lambda k: 1.0 - 0.001 * k).timeline(), DET)  # 0.1 % a step, rtol 1e-4
    assert v.status == "pass" and "re-done report(s) reproduced" in v.message, v.line()
    [v] = state_restored(redone_with(lambda k: 10.0 / (k + 1), restored=False).timeline(), DET)
    assert v.status == "fail" and v.diagnosis is Diagnosis.STATE_NOT_RESTORED, v.line()

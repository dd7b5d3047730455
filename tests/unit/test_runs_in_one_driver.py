"""A driver that calls fit() more than once: every verdict judges the run it is about (the
run the faults hit, each run's own restarts), on recorded timelines."""

from chaos.verdicts import Expect
from chaos.verdicts.budget import within_budget
from chaos.verdicts.resume import resumed_from_latest
from chaos.verdicts.run_finished import run_finished
from timelines import Script, loss

DET = Expect(deterministic=True)
EXPECT_ONE = Expect(charged={"worker_group": 1}, slo_detect_s=10, slo_recover_s=60)


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
    # a warm-up fit() that failed once and retried on its own, then the faulted run: the
    # warm-up's decision is no charge of the faulted run (its own budget), and — no fault
    # explaining it — an unrelated failure, never left out
    s = Script(max_failures=3).start_attempt().steps(1, 3, every=None).decision(error="warm-up flake")
    s.start_attempt().steps(1, 3, every=None)
    s.events.append(s._e("recorder", "run_finished", state="FINISHED"))
    s.new_run().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(11, 20).finish()
    v = within_budget(s.timeline(), EXPECT_ONE)
    assert v.status == "fail" and v.diagnosis == "unrelated failure", v.line()
    assert "in Train run run1, which no fault hit, before any fault was injected" in v.message, v.line()
    assert v.evidence["charged_by_faults"] == {"worker_group": 1}
    # twin: a warm-up that failed nothing; the faulted run's charge as its own
    s = Script(max_failures=3).start_attempt().steps(1, 3, every=None)
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


def faulted_then_another_fit(second_fails_with=None, second_ends="FINISHED"):
    """Run 1 is hit by the fault and resumes; the driver then calls fit() again (run 2, no
    fault), whose attempt 0 fails with ``second_fails_with`` (rank 0's error; None: nothing
    fails) and which ends ``second_ends`` — the job succeeds either way (a driver that catches
    fit()'s error)."""
    s = Script().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(11, 20)
    s.events.append(s._e("recorder", "run_finished", state="FINISHED"))
    s.new_run().start_attempt().steps(1, 7)
    if second_fails_with is not None:
        error, types = second_fails_with
        s.worker_error({0: error}).decision("RETRY" if second_ends == "FINISHED" else "RAISE", error=error,
                                          error_types=("WorkerGroupError", *types))
        if second_ends == "FINISHED":
            s.start_attempt().steps(6, 10)
    s.events.append(s._e("recorder", "run_finished", state=second_ends))
    s.events.append(s._e("harness", "job_finished", status="SUCCEEDED"))
    return s.timeline()


def test_a_failure_in_a_fit_no_fault_hit_is_an_unrelated_failure():
    v = within_budget(faulted_then_another_fit(("ValueError: boom", ("ValueError",))), EXPECT_ONE)
    assert v.status == "fail" and v.diagnosis == "unrelated failure", v.line()
    assert "in Train run run2, which no fault hit" in v.message, v.line()
    # twin: the later fit() fails nothing
    assert within_budget(faulted_then_another_fit(), EXPECT_ONE).status == "pass"
    # twin: its rank on the fault's node lost (the node still gone when it started) is the fault's
    # spill-over, listed, and no charge of the run the faults hit
    v = within_budget(faulted_then_another_fit(("ActorDiedError: the actor died", ("ActorDiedError",))), EXPECT_ONE)
    assert v.status == "pass" and len(v.evidence["other_runs_explained_by_a_fault"]) == 1, v.line()


def test_a_fit_no_fault_hit_that_errored_fails_the_run_though_its_job_succeeded():
    v = run_finished(faulted_then_another_fit(("ValueError: boom", ("ValueError",)), second_ends="ERRORED"),
                     EXPECT_ONE)
    assert v.status == "fail" and v.diagnosis == "run failed", v.line()
    assert "Train run run2, a fit() no fault hit, ended ERRORED" in v.message, v.line()
    assert run_finished(faulted_then_another_fit(), EXPECT_ONE).status == "pass"  # twin: it finished

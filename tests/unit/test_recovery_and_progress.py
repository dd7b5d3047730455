"""recovery-time, run-finished, healed and the findings reached while waiting on a run
(stalled, did not resume, crash loop, ended before the fault), on recorded timelines."""

import pytest

from chaos.verdicts import Expect
from chaos.verdicts.healed import healed
from chaos.verdicts.recovery import recovery_time
from chaos.verdicts.run_finished import run_finished
from timelines import Script, good_run

EXPECT_ONE = Expect(charged={"worker_group": 1}, slo_detect_s=10, slo_recover_s=60)


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

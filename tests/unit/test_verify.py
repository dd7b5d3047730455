"""Every verdict and diagnosis, on recorded timelines."""

import pytest

from chaos.errors import VerificationError
from chaos.verify import (Expectation, check, healed, recovery_time, resumed_from_latest, run_finished,
                          verdicts_for, within_budget)
from timelines import Script

EXPECT_ONE = Expectation(charged={"worker_group": 1}, slo_detect_s=10, slo_recover_s=60)


def good_run():
    return (Script().start_attempt().steps(1, 12).fault().decision()
            .start_attempt().steps(11, 20).finish())


def test_correct_resume_passes_every_verdict():
    verdicts = verdicts_for(good_run().timeline(), EXPECT_ONE)
    assert [v.status for v in verdicts] == ["pass"] * 4, [v.line() for v in verdicts]
    resume = verdicts[0]
    assert resume.evidence["latest_checkpoint_step"] == 10
    assert resume.evidence["first_step_of_attempt"] == 11
    check(verdicts)


def test_restart_from_scratch_is_diagnosed():
    tl = Script().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(1, 20).finish().timeline()
    [v] = resumed_from_latest(tl)
    assert v.status == "fail" and v.diagnosis == "restarted from scratch"
    assert v.message.startswith("restarted from scratch")
    assert v.evidence["latest_checkpoint"] == "/storage/checkpoint_10"


def test_resume_from_older_checkpoint_is_diagnosed():
    tl = Script().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(6, 20).finish().timeline()
    [v] = resumed_from_latest(tl)
    assert v.diagnosis == "resumed from an older checkpoint"
    assert "step 6" in v.message and "latest was step 10" in v.message


def test_resume_from_future_step_is_diagnosed():
    tl = Script().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(14, 20).finish().timeline()
    [v] = resumed_from_latest(tl)
    assert v.diagnosis == "resumed from a future step"


def test_fault_before_any_checkpoint_expects_a_fresh_start():
    tl = Script().start_attempt().steps(1, 3).fault().decision().start_attempt().steps(1, 10).finish().timeline()
    [v] = resumed_from_latest(tl)
    assert v.status == "pass" and v.diagnosis == "no checkpoint existed yet"
    tl = Script().start_attempt().steps(1, 3).fault().decision().start_attempt().steps(2, 10).finish().timeline()
    [v] = resumed_from_latest(tl)
    assert v.status == "fail" and v.diagnosis == "resumed at an unexpected step"


def test_no_step_metric_is_unverifiable_not_guessed():
    s = Script(step_metric="epoch").start_attempt().steps(1, 12, metric=False).fault().decision()
    tl = s.start_attempt().steps(1, 5, metric=False).finish().timeline()
    [v] = resumed_from_latest(tl)
    assert v.status == "unverifiable"
    assert v.message.startswith("unverifiable: no step metric 'epoch'")
    check([v])  # unverifiable is not a failure


def test_two_restarts_give_two_resume_verdicts():
    s = (Script().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(11, 22)
         .fault("n0").decision().start_attempt().steps(21, 30).finish())
    verdicts = resumed_from_latest(s.timeline())
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
    expect = Expectation(charged={"worker_group": 1}, budget_exhausted=True)
    v = within_budget(tl, expect)
    assert v.status == "expected" and "1 failure charged to max_failures=0" in v.message
    assert run_finished(tl, expect).status == "expected"
    assert resumed_from_latest(tl) == []


def test_expected_exhaustion_that_never_happens_fails():
    v = within_budget(good_run().timeline(), Expectation(charged={"worker_group": 1}, budget_exhausted=True))
    assert v.status == "fail" and v.diagnosis == "budget not exhausted"


def test_wrong_budget_class_is_a_finding():
    tl = (Script().start_attempt().steps(1, 12).fault().decision(budget_class="preemption", limit=None)
          .start_attempt().steps(11, 20).finish().timeline())
    v = within_budget(tl, EXPECT_ONE)
    assert v.status == "fail" and v.diagnosis == "charged to the wrong budget class"
    assert "preemption" in v.message


def test_wrong_charge_count_is_a_finding():
    v = within_budget(good_run().timeline(), Expectation(charged={"worker_group": 2}))
    assert v.status == "fail" and v.diagnosis == "unexpected number of charged failures"


def test_decision_without_ray_accounting_is_unverifiable():
    s = Script().start_attempt().steps(1, 12).fault()
    s.events.append(s._e("recorder", "failure_decision", attempt=0, decision="RETRY"))
    v = within_budget(s.start_attempt().steps(11, 20).finish().timeline(), EXPECT_ONE)
    assert v.status == "unverifiable"


def test_recovery_slower_than_slo_fails():
    [v] = recovery_time(good_run().timeline(), Expectation(slo_recover_s=0.5))
    assert v.status == "fail" and v.message.startswith("recovery too slow")
    assert v.evidence["time_to_detect"] == pytest.approx(1.5)
    [v] = recovery_time(good_run().timeline(), Expectation(slo_detect_s=1.0))
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
        check(verdicts_for(tl, EXPECT_ONE))
    assert isinstance(err.value, AssertionError)
    assert str(err.value).startswith("retry budget exhausted: 1 failure charged to max_failures=0")


def test_exhaustion_of_the_wrong_budget_is_a_finding_even_when_exhaustion_is_expected():
    tl = (Script(max_failures=0).start_attempt().steps(1, 6).fault().decision("RAISE", budget_class="preemption", limit=0)
          .finish("ERRORED").timeline())
    v = within_budget(tl, Expectation(charged={"worker_group": 1}, budget_exhausted=True))
    assert v.status == "fail" and v.diagnosis == "charged to the wrong budget class"
    assert "max_preemption_failures=0" in v.message

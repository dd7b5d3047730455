"""within-budget: each failure decision attributed to its fault (or unrelated), each fault
charged to its class, the totals and an expected exhaustion, on recorded timelines."""


from chaos.verdicts import Expect
from chaos.verdicts.budget import within_budget
from chaos.verdicts.resume import resumed_from_latest
from chaos.verdicts.run_finished import run_finished
from timelines import Script, good_run

DET = Expect(deterministic=True)
EXPECT_ONE = Expect(charged={"worker_group": 1}, slo_detect_s=10, slo_recover_s=60)


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


def test_exhaustion_of_the_wrong_budget_is_a_finding_even_when_exhaustion_is_expected():
    tl = (Script(max_failures=0).start_attempt().steps(1, 6).fault().decision("RAISE", budget_class="preemption", limit=0)
          .finish("ERRORED").timeline())
    v = within_budget(tl, Expect(charged={"worker_group": 1}, budget_exhausted=True))
    assert v.status == "fail" and v.diagnosis == "charged to the wrong budget class"
    assert "max_preemption_failures=0" in v.message


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


def two_kills_then_exhausted(first_class):
    """Two raylet kills under max_failures=1: the first charged to ``first_class`` and retried,
    the second exhausts max_failures (Ray raises at count 1 + the first's, if it went there)."""
    s = Script(max_failures=1).start_attempt().steps(1, 12)
    s.fault(kind="raylet-kill").decision(budget_class=first_class, limit=1 if first_class == "worker_group" else 2)
    s.start_attempt().steps(11, 16).fault(kind="raylet-kill")
    s.decision("RAISE", budget_class="worker_group", limit=1 if first_class == "worker_group" else 0)
    return s.finish("ERRORED").timeline()


def test_an_expected_exhaustion_does_not_hide_an_earlier_fault_charged_to_the_wrong_class():
    e = Expect(budget_exhausted=True, charged={"worker_group": 2})
    v = within_budget(two_kills_then_exhausted("preemption"), e)
    assert v.status == "fail" and v.diagnosis == "charged to the wrong budget class", v.line()
    assert "the raylet-kill fault's failure (attempt 0) was charged to max_preemption_failures" in v.message
    v = within_budget(two_kills_then_exhausted("worker_group"), e)  # the twin: both in their class
    assert v.status == "expected" and "2 failures charged to max_failures=1" in v.message, v.line()

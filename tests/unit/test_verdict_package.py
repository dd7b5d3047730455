"""The verdict package's own rules (chaos.verdicts): one status order and merge, one
keyword-only immutable Expect, one composer that never lets a checker's exception pass or
hide the other verdicts, the diagnoses spelt once, typed event payloads."""

import dataclasses
import json

import pytest
from pydantic import ValidationError

from chaos import allure_site
from chaos.errors import VerificationError
from chaos.timeline import Event
from chaos.verdicts import CHECKERS, Baseline, Diagnosis, Expect, Kind, ReportCategory, Status, Verdict, check, judge
from chaos.verdicts import events
from chaos.verdicts.compose import safely
from chaos.verdicts.diagnosis import report_phrases
from chaos.verdicts.tolerance import close, same_state, same_step, step_key
from timelines import Script, good_run


def test_statuses_merge_to_the_one_that_tells_most():
    assert Status.merge([Status.PASS, Status.NOT_APPLICABLE]) is Status.PASS  # n/a is no claim
    assert Status.merge([Status.PASS, Status.EXPECTED]) is Status.EXPECTED
    assert Status.merge([Status.WARNING, Status.PASS]) is Status.WARNING
    assert Status.merge([Status.PASS, Status.UNVERIFIABLE, Status.WARNING]) is Status.UNVERIFIABLE
    assert Status.merge([Status.UNVERIFIABLE, Status.FAIL, Status.PASS]) is Status.FAIL
    assert Status.merge([]) is Status.NOT_APPLICABLE
    assert [s.value for s in sorted(Status, key=lambda s: s.rank)] == [
        "n/a", "pass", "expected", "warning", "unverifiable", "fail"]


def test_only_fail_and_by_default_unverifiable_fail_a_test():
    assert [s.value for s in Status if s.fails()] == ["unverifiable", "fail"]
    assert [s.value for s in Status if s.fails("warn")] == ["fail"]
    check([Verdict("x", Status.WARNING, "state differs: ...", Diagnosis.STATE_DIFFERS)])


def test_expect_is_keyword_only_and_never_changed_in_place():
    with pytest.raises(TypeError):
        Expect({"worker_group": 1})  # type: ignore[misc]  # positional: refused
    e = Expect(charged={"worker_group": 1})
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.budget_exhausted = True  # type: ignore[misc]
    again = dataclasses.replace(e, budget_exhausted=True)
    assert (e.budget_exhausted, again.budget_exhausted, again.charges) == (False, True, {"worker_group": 1})


def test_expect_round_trips_through_json_and_reads_the_earlier_fixtures_spelling():
    base = Baseline("k", trajectory={0: [[1, {"loss": 1.0}]]}, job_id="b")
    e = Expect(charged={"worker_group": 1}, baseline=True, deterministic=True, reference=base,
               charge_outcomes=({"worker_group": 1},))
    assert Expect.from_json(json.loads(json.dumps(e.to_json()))) == e
    old = {"charged": {"worker_group": 1}, "trajectory": base.to_json(), "final_state": None, "deterministic": True,
           "state_rtol": 1e-4, "charge_outcomes": None}
    read = Expect.from_json(old)
    assert read.trajectory == base and read.final_state is False and read.baseline is True


class Broken:
    name = "broken"
    judges_a_stopped_run = True

    def applies(self, expect):
        return True

    def check(self, timeline, expect):
        raise KeyError("attempt")


def test_a_checker_that_raises_is_unverifiable_naming_it_and_the_others_still_judge():
    tl = Script().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(11, 20).finish().timeline()
    verdicts = judge(tl, Expect(charged={"worker_group": 1}), checkers=(Broken(), *CHECKERS))
    broken = verdicts[0]
    assert broken.status is Status.UNVERIFIABLE and broken.diagnosis is Diagnosis.CHECKER_FAILED, broken.line()
    assert broken.message == "unverifiable: checker failed: the broken checker raised KeyError: 'attempt'"
    assert "Traceback" in broken.evidence["traceback"]
    assert [v.status for v in verdicts[1:]] == ["pass"] * 4, [v.line() for v in verdicts]
    with pytest.raises(AssertionError, match="checker failed"):
        check(verdicts)
    # the twin: a checker that judges gives its own verdicts
    assert safely(CHECKERS[1], tl, Expect())[0].status is Status.PASS


def test_a_stopped_run_is_judged_only_by_the_checkers_that_judge_one():
    tl = Script().start_attempt().steps(1, 12).fault().decision().start_attempt().steps(11, 14).timeline()
    names = [v.name for v in judge(tl, Expect(charged={"worker_group": 1}), finished=False)]
    assert names == ["resumed-from-latest (attempt 1)"], names
    assert "within-budget" in [v.name for v in judge(tl, Expect(charged={"worker_group": 1}))]


def test_every_diagnosis_carries_its_kind_report_category_verdicts_and_doc_line():
    for d in Diagnosis:
        assert isinstance(d.kind, Kind) and isinstance(d.report, ReportCategory) and d.verdicts and d.doc, d
        assert (d.kind is Kind.UNVERIFIABLE) == d.value.startswith(("unverifiable: ", "inconclusive")), d
        assert (d.report is ReportCategory.UNVERIFIABLE) == (d.kind is Kind.UNVERIFIABLE), d
    assert len({d.value for d in Diagnosis}) == len(Diagnosis)


def test_the_reports_categories_are_the_diagnoses():
    """Every finding files its test under its category; missing evidence under one; warnings
    and expected outcomes (which never fail a test) under none."""
    regex = {c["name"]: c.get("messageRegex") for c in allure_site.CATEGORIES}
    for d in Diagnosis:
        if d.kind is Kind.FINDING:
            assert d.value in report_phrases(d.report) and d.report.value in regex, d
    assert not [d for d in Diagnosis if d.kind in (Kind.WARNING, Kind.EXPECTED)
                and any(d.value in report_phrases(c) for c in ReportCategory)]
    assert list(regex)[:3] == ["restarted from scratch", "resumed from an older checkpoint",
                               "resumed past the checkpoint (skipped data)"]


def test_one_tolerance_for_steps_and_states():
    assert same_step(1.1, 1.0999999999999999) and not same_step(1.1, 1.2)
    assert step_key(1.1) == step_key(1.0999999999999999) and step_key(10.0) == 10
    assert same_state(1.0, 1.00005) and not same_state(1.0, 1.001)
    assert same_state(1.0, 1.001, rtol=1e-2)
    assert not close(float("nan"), float("nan"), 1.0) and not close(None, 1, 1.0)
    assert close("digest-a", "digest-a", 0.0) and not close("digest-a", "digest-b", 1.0)


def test_the_payloads_the_verdicts_read_are_typed_and_a_wrong_one_fails_loudly():
    e = Event(1.0, "recorder", "report", {"run_id": "r", "attempt": 1, "steps": {"0": 5, "1": 5.5},
                                          "states": {"0": 1, "1": None}, "checkpoint": "/s/ck",
                                          "checkpoint_after_step": {"0": 4}})
    r = events.report(e)
    assert r.steps == {0: 5, 1: 5.5} and isinstance(r.steps[0], int) and r.states == {0: 1.0, 1: None}
    assert r.checkpoint_after_step == {0: 4}
    assert events.EventKind("report") is events.EventKind.REPORT and e.kind == events.EventKind.REPORT
    with pytest.raises(ValidationError):
        events.report(Event(1.0, "recorder", "report", {"attempt": "first"}))
    with pytest.raises(TypeError):
        events.report(Event(1.0, "recorder", "attempt_started", {"attempt": 0}))
    assert isinstance(events.payload(Event(1.0, "recorder", "failure_decision", {"decision": "RETRY"})),
                      events.FailureDecision)


EXPECT_ONE = Expect(charged={"worker_group": 1}, slo_detect_s=10, slo_recover_s=60)


def test_correct_resume_passes_every_verdict():
    verdicts = judge(good_run().timeline(), EXPECT_ONE)
    assert [v.status for v in verdicts] == ["pass"] * 4, [v.line() for v in verdicts]
    resume = verdicts[0]
    assert resume.evidence["latest_checkpoint_step"] == 10
    assert resume.evidence["first_step_of_attempt"] == 11
    check(verdicts)


def test_check_raises_an_assertion_with_every_failed_message():
    tl = Script(max_failures=0).start_attempt().steps(1, 6).fault().decision("RAISE", limit=0).finish("ERRORED").timeline()
    with pytest.raises(VerificationError) as err:
        check(judge(tl, EXPECT_ONE))
    assert isinstance(err.value, AssertionError)
    assert str(err.value).startswith("retry budget exhausted: 1 failure charged to max_failures=0")


def test_a_baseline_check_the_suite_asked_for_without_a_baseline_is_unverifiable_never_left_out():
    tl = good_run().timeline()
    for asked, name in ((Expect(final_state=True), "final-state"), (Expect(baseline=True), "state-trajectory")):
        [v] = [v for v in judge(tl, dataclasses.replace(asked, charged={"worker_group": 1})) if v.name == name]
        assert v.status == "unverifiable" and v.diagnosis is Diagnosis.NO_BASELINE, v.line()
    # the twins: not asked, no verdict; asked with one, judged against it
    assert not {"final-state", "state-trajectory"} & {v.name for v in judge(tl, EXPECT_ONE)}
    base = Baseline("k", final={0: {"step": 20, "state": {}}, 1: {"step": 20, "state": {}}}, job_id="b", made_at="t")
    [v] = [v for v in judge(tl, dataclasses.replace(EXPECT_ONE, final_state=True, reference=base))
           if v.name == "final-state"]
    assert v.diagnosis is not Diagnosis.NO_BASELINE, v.line()

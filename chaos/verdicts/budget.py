"""within-budget: every failure decision of the run the faults hit is attributed to the
injected fault that caused it or marked unrelated (chaos.attribution); each fault is charged
to its kind's budget class, the charges per class are what the faults should cost, and an
expected exhaustion happens.

Ordered rules over the same facts, the first that has something to say decides: no
accounting, unrelated, exhausted, not exhausted, each fault's class, the totals, the
platform's charge, then the evidence behind a pass (timing alone, events missing).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

from chaos.attribution import Attribution, attribute, faulted_run_decisions
from chaos.faults.catalog import KINDS, limit_name
from chaos.timeline import Event, Timeline
from chaos.verdicts import events
from chaos.verdicts.diagnosis import Diagnosis
from chaos.verdicts.expect import Expect
from chaos.verdicts.gaps import decisions_gap, diagnosis_of, missing
from chaos.verdicts.states import faulted_run_events
from chaos.verdicts.status import Status
from chaos.verdicts.verdict import Verdict

NAME = "within-budget"


class WithinBudget:
    name = NAME
    judges_a_stopped_run = False

    def applies(self, expect: Expect) -> bool:
        return True

    def check(self, timeline: Timeline, expect: Expect) -> list[Verdict]:
        return [within_budget(timeline, expect)]


@dataclasses.dataclass
class Facts:
    """What every rule reads: the decisions, who caused each, and the charges."""

    expect: Expect
    decisions: list[Event]
    att: Attribution
    primary: list[tuple[str, Event]]  # (fault key, its own charge) for faults that are not the platform's
    by_class: collections.Counter[str]
    raced: list[tuple[str, Event]]  # charges that went to the class Ray's own race gives their kind
    platform: dict[str, int]  # what the lasting faults (xid, storage: a measured charge) were charged
    gap: Event | None
    evidence: dict[str, Any]

    def verdict(self, status: Status, message: str, diagnosis: Diagnosis | None = None) -> Verdict:
        return Verdict(NAME, status, message, diagnosis, self.evidence)

    def expected_class(self, key: str) -> str | None:
        """The class a fault's own charge must go to: the suite's (``Expect.charge_by_kind``: the
        profile's expected_budget; None for a kind there: no class claimed), else the catalog's."""
        kind = self.att.kinds.get(key) or ""
        by_kind = self.expect.charge_by_kind or {}
        if kind in by_kind:
            return by_kind[kind]
        return KINDS[kind].budget_class if kind in KINDS else None


def _first_line(text: str | None) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return (lines[-1] if lines else "no error text")[:300]


def _reading_json(att: Attribution, d: Event) -> dict[str, Any]:
    seen = att.reading(d)
    return seen.to_json() if seen is not None else {}


def _raced(kind: str | None, decision: Event) -> bool:
    """The decision is charged to the class its fault's kind may get by a race in Ray (catalog)."""
    entry = KINDS.get(kind or "")
    return bool(entry and entry.race_charge and decision.data.get("budget_class") == entry.race_charge)


def facts(timeline: Timeline, expect: Expect) -> Facts:
    decisions = faulted_run_decisions(timeline)
    att = attribute(timeline)
    primary = [(k, d) for k in att.by_fault if k not in att.lasting for d in att.charges(k)]
    by_class = collections.Counter(str(d.data.get("budget_class")) for _, d in primary)
    raced = [(k, d) for k, d in primary if _raced(att.kinds.get(k), d)]
    platform = dict(collections.Counter(str(d.data.get("budget_class")) for k in att.lasting for d in att.charges(k)))
    started = next((e for e in faulted_run_events(timeline) if e.kind == "controller_started"), None)
    f = Facts(expect, decisions, att, primary, by_class, raced, platform, decisions_gap(timeline), {})
    f.evidence = _evidence(f, started.data.get("failure_config", {}) if started else {})
    return f


def _evidence(f: Facts, failure_config: dict[str, Any]) -> dict[str, Any]:
    att = f.att
    return {"charged_by_faults": dict(f.by_class), "expected_charges": dict(f.expect.charged or {}),
            "failure_config": failure_config, "charged_by_node_recovery_faults": f.platform,
            "charge_outcomes": [dict(o) for o in f.expect.charge_outcomes or ()] or f.expect.charge_outcomes,
            "decisions": [{k: e.data.get(k) for k in ("run_id", "attempt", "decision", "budget_class", "count",
                                                      "limit")} | {"t": e.t} for e in f.decisions],
            "attributed": {k: [d.t for d in v] for k, v in att.by_fault.items()},
            "charged_per_fault": [{"fault": att.kinds.get(k), "charged": d.data.get("budget_class"),
                                   "should_be": f.expected_class(k), "attempt": d.attempt} for k, d in f.primary],
            "capacity_waits": [{"budget_class": d.data.get("budget_class"), "error_types": d.data.get("error_types"),
                                "error": _first_line(d.data.get("error"))} for d in att.consequential],
            "unrelated": [{"attempt": d.attempt, "budget_class": d.data.get("budget_class"),
                           "error_types": d.data.get("error_types"), "error": _first_line(d.data.get("error"))}
                          | _reading_json(att, d) for d in att.unrelated],
            "attributed_why": {k: [_reading_json(att, d).get("why") for d in v] for k, v in att.by_fault.items()},
            "other_runs_explained_by_a_fault": [{"run_id": d.data.get("run_id"), "attempt": d.attempt,
                                                  "error_types": d.data.get("error_types")} | _reading_json(att, d)
                                                 for d in att.spilled],
            "attributed_by_time_only": [{"attempt": d.attempt, "budget_class": d.data.get("budget_class"),
                                         "error_types": d.data.get("error_types")} | _reading_json(att, d)
                                        for d in att.by_time],
            "raced": [{"attempt": d.attempt, "fault": att.kinds[k], "charged": d.data.get("budget_class"),
                       "counted_as": KINDS[att.kinds[k]].budget_class} for k, d in f.raced]}


# -- the rules, in order ------------------------------------------------------------------
def _no_accounting(f: Facts) -> Verdict | None:
    if f.decisions and any(not e.data.get("budget_class") for e in f.decisions):
        return f.verdict(Status.UNVERIFIABLE, "unverifiable: a failure decision came without Ray's [FailurePolicy] "
                         "accounting", Diagnosis.NO_POLICY_RECORD)
    return None


def _unrelated(f: Facts) -> Verdict | None:
    if not f.att.unrelated:
        return None
    d = f.att.unrelated[0]
    seen = f.att.reading(d)
    why = f": {seen.why}" if seen is not None else ""
    error = (seen.error if seen is not None else None) or _first_line(d.data.get("error"))
    return f.verdict(Status.FAIL, f"unrelated failure: attempt {d.attempt} failed with {error} (charged to "
                     f"{limit_name(d.data.get('budget_class') or '?')}), and no injected fault explains it{why} "
                     f"({len(f.att.unrelated)} such decision(s))", Diagnosis.UNRELATED_FAILURE)


def _exhausted(f: Facts) -> Verdict | None:
    raised = [d for d in (events.FailureDecision.model_validate(e.data) for e in f.decisions) if d.decision == "RAISE"]
    if not raised:
        return None
    cls, count, limit = str(raised[-1].budget_class), raised[-1].count, raised[-1].limit
    msg = f"retry budget exhausted: {count} failure{'s' if count != 1 else ''} charged to {limit_name(cls)}={limit}"
    if not f.expect.budget_exhausted:
        return f.verdict(Status.FAIL, msg, Diagnosis.BUDGET_EXHAUSTED)
    if f.expect.charges and cls not in f.expect.charges:
        return f.verdict(Status.FAIL, f"charged to the wrong budget class: {msg}, but the faults should have been "
                         f"charged to {sorted(f.expect.charges)}", Diagnosis.WRONG_BUDGET_CLASS)
    if limit is not None and count != limit + 1:
        return f.verdict(Status.FAIL, f"unexpected number of charged failures: Ray raised at count {count} with "
                         f"{limit_name(cls)}={limit}; exhaustion is the ({limit + 1})th failure",
                         Diagnosis.WRONG_CHARGE_COUNT)
    # an exhaustion seen as expected says nothing of the faults that Ray retried before it
    return _each_fault_its_class(f) or _evidence_behind(f, msg + " (as this suite expects)", Status.EXPECTED,
                                                        Diagnosis.BUDGET_EXHAUSTED)


def _not_exhausted(f: Facts) -> Verdict | None:
    if not f.expect.budget_exhausted:
        return None
    msg = ("budget not exhausted: the suite expected the retry budget to run out, "
           f"but Ray kept retrying (charged {dict(f.by_class) or 'nothing'})")
    if f.gap is not None:
        return _missing_decision(f, msg)
    return f.verdict(Status.FAIL, msg, Diagnosis.BUDGET_NOT_EXHAUSTED)


def _each_fault_its_class(f: Facts) -> Verdict | None:
    """Each fault's own charge goes to its kind's class (or the one Ray's race gives it): two
    faults charged each other's classes keep the totals and are still both wrong."""
    wrong = [(k, d) for k, d in f.primary if f.expected_class(k) is not None
             and d.data.get("budget_class") != f.expected_class(k) and (k, d) not in f.raced]
    if not wrong:
        return None
    parts = "; ".join(f"the {f.att.kinds.get(k)} fault's failure (attempt {d.attempt}) was charged to "
                      f"{limit_name(str(d.data.get('budget_class')))}, a {f.att.kinds.get(k)} fault costs "
                      f"{limit_name(str(f.expected_class(k)))}" for k, d in wrong)
    return f.verdict(Status.FAIL, f"charged to the wrong budget class: {parts}", Diagnosis.WRONG_BUDGET_CLASS)


def _relabelled(f: Facts) -> tuple[dict[str, int], str]:
    """The per-class counts, with the charges Ray's own race moved counted as their kind's
    where that is what makes them match (and a note saying so)."""
    counts, want = dict(f.by_class), f.expect.charges
    if counts == want or not f.raced:
        return counts, ""
    moved = collections.Counter(str(KINDS[f.att.kinds[k]].budget_class) for k, _ in f.raced)
    moved.subtract(collections.Counter(str(d.data.get("budget_class")) for _, d in f.raced))
    relabelled = dict(collections.Counter(f.by_class) + moved)  # + keeps the positive counts only
    if relabelled != want:
        return counts, ""
    return relabelled, "; " + "; ".join(
        f"the {f.att.kinds[k]} fault's failure (attempt {d.attempt}) was charged to "
        f"{limit_name(str(d.data.get('budget_class')))} instead, by a race in Ray: {KINDS[f.att.kinds[k]].race_why}"
        for k, d in f.raced)


def _totals(f: Facts) -> Verdict | None:
    counts, _ = _relabelled(f)
    want = f.expect.charges
    if counts == want:
        return None
    wrong = set(counts) - set(want)
    diagnosis = Diagnosis.WRONG_BUDGET_CLASS if wrong else Diagnosis.WRONG_CHARGE_COUNT
    msg = f"{diagnosis.value}: the injected faults were charged {counts or 'nothing'}, they should have charged {want}"
    if f.gap is not None and not wrong and all(n <= want[c] for c, n in counts.items()):
        return _missing_decision(f, msg)  # the ones short may be among the missing
    return f.verdict(Status.FAIL, msg, diagnosis)


def _lasting_kinds(f: Facts) -> str:
    """The lasting faults, as a message names them: ``the xid fault(s)``."""
    return "the " + ", ".join(sorted({str(f.att.kinds.get(k)) for k in f.att.lasting})) + " fault(s)"


def _platform_charge(f: Facts) -> Verdict | None:
    if not f.att.lasting:
        return None
    outcomes = [dict(o) for o in f.expect.charge_outcomes] if f.expect.charge_outcomes is not None else None
    if outcomes is None:
        return f.verdict(Status.UNVERIFIABLE, f"unverifiable: no measured outcomes: {_lasting_kinds(f)} were charged "
                         f"{f.platform or 'nothing'}, which depends on how the platform's recovery or the fault's "
                         "window played out; say which charges you measured and accept "
                         "(chaos.expect(charge_outcomes=[...]))", Diagnosis.NO_MEASURED_OUTCOMES)
    if f.platform not in outcomes:
        return f.verdict(Status.FAIL, f"charge not among the measured outcomes: {_lasting_kinds(f)} were charged "
                         f"{f.platform or 'nothing'}; the outcomes measured for them: {outcomes}",
                         Diagnosis.CHARGE_NOT_MEASURED)
    return None


def _within(f: Facts) -> Verdict:
    limits = charged_by_class(f.decisions)
    parts = [f"{n} to {limit_name(c)}={limits[c]['limit'] if limits[c]['limit'] is not None else 'unlimited'}"
             for c, n in (f.by_class + collections.Counter(f.platform)).items()]
    extra = ""
    if f.att.consequential:
        waits = collections.Counter(str(d.data.get("budget_class")) for d in f.att.consequential)
        extra = "; plus " + ", ".join(f"{n} to {limit_name(c)} while the worker group waited for the lost capacity"
                                      for c, n in waits.items())
    extra += _relabelled(f)[1]
    if f.att.lasting:
        extra += (f"; {_lasting_kinds(f)} charged {f.platform or 'nothing'} (what Ray made of the fault as it played "
                  "out, one of the measured outcomes)")
    return _evidence_behind(f, "charged " + (", ".join(parts) or "nothing") + ", as the faults should" + extra,
                            Status.PASS, None)


def _evidence_behind(f: Facts, read: str, status: Status, diagnosis: Diagnosis | None) -> Verdict:
    """A charge that would pass (or an exhaustion seen as expected) stands only on evidence:
    not on a decision claimed by its timing alone, nor across events nobody read."""
    if f.att.by_time:
        d = f.att.by_time[0]
        seen = f.att.reading(d)
        return f.verdict(Status.UNVERIFIABLE, f"unverifiable: no failure evidence: attempt {d.attempt}'s failure "
                         f"(charged to {limit_name(d.data.get('budget_class') or '?')}) came after the fault, but "
                         f"{seen.why if seen is not None else 'nothing recorded says what failed'}: only its timing "
                         "ties it to the fault, which cannot tell the fault's failure from another one "
                         f"({len(f.att.by_time)} such decision(s))", Diagnosis.NO_FAILURE_EVIDENCE)
    if f.gap is not None:
        return _missing_decision(f, read)
    return f.verdict(status, read, diagnosis)


def _missing_decision(f: Facts, read: str) -> Verdict:
    """Charges judged on the decisions read, where one may be missing: neither a pass nor a
    shortfall (fewer charges, no exhaustion) means anything."""
    assert f.gap is not None
    diagnosis = diagnosis_of(f.gap)
    return Verdict(NAME, Status.UNVERIFIABLE, f"{diagnosis.value}: {missing(f.gap)}, so a failure decision its "
                   f"controller made then would be missing (what was read: {read})", diagnosis,
                   {**f.evidence, f.gap.kind: f.gap.data})


RULES: tuple[Callable[[Facts], Verdict | None], ...] = (
    _no_accounting, _unrelated, _exhausted, _not_exhausted, _each_fault_its_class, _totals, _platform_charge)


def within_budget(timeline: Timeline, expect: Expect | None = None) -> Verdict:
    f = facts(timeline, expect or Expect())
    for rule in RULES:
        verdict = rule(f)
        if verdict is not None:
            return verdict
    return _within(f)


def charged_by_class(decisions: list[Event]) -> dict[str, dict[str, Any]]:
    """Failures Ray charged per budget class: the last decision's count and limit."""
    out: dict[str, dict[str, Any]] = {}
    for d in (events.FailureDecision.model_validate(e.data) for e in decisions):
        if d.budget_class:
            out[d.budget_class] = {"count": d.count, "limit": d.limit, "decision": d.decision}
    return out


def charged(timeline: Timeline) -> dict[str, dict[str, Any]]:
    """Failures Ray charged per budget class in the runs the faults hit (summary.json's figures)."""
    return charged_by_class(faulted_run_decisions(timeline))

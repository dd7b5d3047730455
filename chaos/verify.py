"""Verdicts: checked claims about a timeline, each carrying its evidence.

Knows nothing about transports or clusters: everything it judges is in the timeline
(recorder, fault and node events) plus the expectations the suite states.

Statuses: ``pass``; ``fail``; ``unverifiable`` (the evidence to decide is missing, e.g.
no step metric — never guessed); ``expected`` (an expected failure was correctly seen,
e.g. an exhausted retry budget in a budget-exhaustion suite).  Failure messages start
with the diagnosis phrase, which the report's categories match on.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from chaos.errors import VerificationError
from chaos.timeline import Event, Timeline, recovery_metrics

LIMIT_NAMES = {"worker_group": "max_failures", "preemption": "max_preemption_failures",
               "controller": "controller_failure_limit"}


@dataclasses.dataclass
class Verdict:
    name: str
    status: str  # pass | fail | unverifiable | expected
    message: str
    diagnosis: str | None = None
    evidence: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def line(self) -> str:
        return f"[{self.status.upper():>12}] {self.name}: {self.message}"


@dataclasses.dataclass
class Expectation:
    """What the suite says should happen."""

    charged: dict[str, int] = dataclasses.field(default_factory=dict)  # budget class -> failures
    budget_exhausted: bool = False
    slo_detect_s: float | None = None
    slo_recover_s: float | None = None


# -- resumed-from-latest -------------------------------------------------------------
def resumed_from_latest(timeline: Timeline) -> list[Verdict]:
    """One verdict per restart: did attempt k+1 start right after the latest checkpoint?"""
    attempts = sorted(timeline.attempts(), key=lambda e: e.attempt)
    reports = timeline.reports()
    if len(attempts) < 2:
        return []
    if not any(r.data.get("step") is not None for r in reports):
        metric = (timeline.first("controller_started") or Event(0, "", "", {})).data.get("step_metric", "step")
        return [Verdict("resumed-from-latest", "unverifiable",
                        f"unverifiable: no step metric {metric!r} in the run's reports; pass --chaos-step-metric "
                        "with the metric your script reports", "unverifiable: no step metric",
                        {"reports": len(reports), "step_metric": metric})]
    first0 = next((r.data["step"] for r in reports if r.attempt == attempts[0].attempt
                   and r.data.get("step") is not None), None)
    verdicts = []
    for new in attempts[1:]:
        before = [r for r in reports if r.t <= new.t and r.data.get("step") is not None]
        commits = [r for r in before if r.data.get("checkpoint")]
        first = next((r for r in reports if r.attempt == new.attempt and r.data.get("step") is not None), None)
        evidence = {
            "attempt": new.attempt,
            "latest_checkpoint": commits[-1].data["checkpoint"] if commits else None,
            "latest_checkpoint_step": commits[-1].data["step"] if commits else None,
            "committed_steps": [c.data["step"] for c in commits],
            "first_step_of_attempt": first.data["step"] if first else None,
            "first_step_of_run": first0,
            "max_step_before_restart": max((r.data["step"] for r in before), default=None),
        }
        name = f"resumed-from-latest (attempt {new.attempt})"
        if first is None:
            verdicts.append(Verdict(name, "unverifiable", f"unverifiable: attempt {new.attempt} reported no step",
                                    "unverifiable: no report in attempt", evidence))
            continue
        got = first.data["step"]
        if not commits:
            ok = got == first0
            verdicts.append(Verdict(
                name, "pass" if ok else "fail",
                (f"no checkpoint existed yet: attempt {new.attempt} correctly started from step {got}" if ok else
                 f"resumed at an unexpected step: no checkpoint existed yet, so step {first0} was expected, got {got}"),
                "no checkpoint existed yet" if ok else "resumed at an unexpected step", evidence))
            continue
        latest = commits[-1].data["step"]
        older = [c.data["step"] for c in commits[:-1]]
        if got == latest + 1:
            verdicts.append(Verdict(name, "pass", f"attempt {new.attempt} resumed at step {got}, right after the "
                                    f"latest checkpoint (step {latest})", None, evidence))
        elif got == first0:
            verdicts.append(Verdict(name, "fail", f"restarted from scratch: attempt {new.attempt} began at step {got} "
                                    f"although checkpoint step {latest} was committed "
                                    f"({evidence['latest_checkpoint']})", "restarted from scratch", evidence))
        elif got - 1 in older:
            verdicts.append(Verdict(name, "fail", f"resumed from an older checkpoint: attempt {new.attempt} began at "
                                    f"step {got} (after checkpoint step {got - 1}), the latest was step {latest}",
                                    "resumed from an older checkpoint", evidence))
        elif got > latest + 1:
            verdicts.append(Verdict(name, "fail", f"resumed from a future step: attempt {new.attempt} began at step "
                                    f"{got}, past the latest checkpoint (step {latest})",
                                    "resumed from a future step", evidence))
        else:
            verdicts.append(Verdict(name, "fail", f"resumed at an unexpected step: attempt {new.attempt} began at "
                                    f"step {got}, expected {latest + 1}", "resumed at an unexpected step", evidence))
    return verdicts


# -- within-budget ---------------------------------------------------------------------
def charged(timeline: Timeline) -> dict[str, dict]:
    """Failures Ray charged per budget class: the last decision's count and limit."""
    out: dict[str, dict] = {}
    for e in timeline.of("failure_decision"):
        cls = e.data.get("budget_class")
        if cls:
            out[cls] = {"count": e.data.get("count"), "limit": e.data.get("limit"), "decision": e.data.get("decision")}
    return out


def within_budget(timeline: Timeline, expect: Expectation) -> Verdict:
    decisions = timeline.of("failure_decision")
    got = charged(timeline)
    started = timeline.first("controller_started")
    fc = started.data.get("failure_config", {}) if started else {}
    evidence = {"charged": got, "expected_charges": expect.charged, "failure_config": fc,
                "decisions": [{k: e.data.get(k) for k in ("attempt", "decision", "budget_class", "count", "limit")}
                              for e in decisions]}
    if decisions and any(not e.data.get("budget_class") for e in decisions):
        return Verdict("within-budget", "unverifiable", "unverifiable: a failure decision came without Ray's "
                       "[FailurePolicy] accounting", "unverifiable: no failure-policy record", evidence)
    raised = [e for e in decisions if e.data.get("decision") == "RAISE"]
    if raised:
        cls = raised[-1].data["budget_class"]
        count, limit = raised[-1].data.get("count"), raised[-1].data.get("limit")
        msg = (f"retry budget exhausted: {count} failure{'s' if count != 1 else ''} charged to "
               f"{LIMIT_NAMES.get(cls, cls)}={limit}")
        if expect.budget_exhausted:
            if expect.charged and cls not in expect.charged:
                return Verdict("within-budget", "fail", f"charged to the wrong budget class: {msg}, but the faults "
                               f"should have been charged to {sorted(expect.charged)}",
                               "charged to the wrong budget class", evidence)
            return Verdict("within-budget", "expected", msg + " (as this suite expects)",
                           "retry budget exhausted", evidence)
        return Verdict("within-budget", "fail", msg, "retry budget exhausted", evidence)
    if expect.budget_exhausted:
        return Verdict("within-budget", "fail", "budget not exhausted: the suite expected the retry budget to run out, "
                       f"but Ray kept retrying (charged {got or 'nothing'})", "budget not exhausted", evidence)
    counts = {cls: v["count"] for cls, v in got.items()}
    if counts != {k: v for k, v in expect.charged.items() if v}:
        wrong = set(counts) - set(expect.charged)
        diagnosis = "charged to the wrong budget class" if wrong else "unexpected number of charged failures"
        return Verdict("within-budget", "fail", f"{diagnosis}: Ray charged {counts or 'nothing'}, the faults should "
                       f"have charged {expect.charged}", diagnosis, evidence)
    parts = [f"{n} to {LIMIT_NAMES.get(c, c)}={got[c]['limit'] if got[c]['limit'] is not None else 'unlimited'}"
             for c, n in counts.items()]
    return Verdict("within-budget", "pass", "charged " + (", ".join(parts) or "nothing") + ", as the faults should",
                   None, evidence)


# -- recovery-time ---------------------------------------------------------------------
def recovery_time(timeline: Timeline, expect: Expectation) -> list[Verdict]:
    verdicts = []
    for i, m in enumerate(recovery_metrics(timeline)):
        evidence = dataclasses.asdict(m) | {"slo_detect_s": expect.slo_detect_s, "slo_recover_s": expect.slo_recover_s}
        name = f"recovery-time (fault {i + 1})"
        if expect.budget_exhausted:
            verdicts.append(Verdict(name, "pass", f"detected in {_s(m.time_to_detect)}; no recovery expected "
                                    "(budget exhausted)", None, evidence))
            continue
        problems = []
        if m.time_to_recover is None:
            problems.append("training never resumed after the fault")
        elif expect.slo_recover_s is not None and m.time_to_recover > expect.slo_recover_s:
            problems.append(f"time to recover {_s(m.time_to_recover)} > SLO {expect.slo_recover_s:.1f} s")
        if expect.slo_detect_s is not None and m.time_to_detect is not None and m.time_to_detect > expect.slo_detect_s:
            problems.append(f"time to detect {_s(m.time_to_detect)} > SLO {expect.slo_detect_s:.1f} s")
        summary = (f"detected in {_s(m.time_to_detect)}, next attempt after {_s(m.time_to_restart)}, "
                   f"first report after {_s(m.time_to_recover)}")
        if problems:
            verdicts.append(Verdict(name, "fail", "recovery too slow: " + "; ".join(problems) + f" ({summary})",
                                    "recovery too slow", evidence))
        else:
            verdicts.append(Verdict(name, "pass", summary, None, evidence))
    return verdicts


def _s(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f} s"


# -- run-finished ----------------------------------------------------------------------
def run_finished(timeline: Timeline, expect: Expectation) -> Verdict:
    fin = timeline.first("run_finished")
    job = timeline.first("job_finished")
    evidence = {"run_state": fin.data.get("state") if fin else None, "job_status": job.data.get("status") if job else None,
                "error": (fin.data.get("error") if fin else None) or (job.data.get("message") if job else None)}
    if fin is None:
        return Verdict("run-finished", "fail", "run did not finish: no final controller state was recorded "
                       f"(job status {evidence['job_status']})", "run did not finish", evidence)
    state = fin.data.get("state")
    if expect.budget_exhausted:
        ok = state == "ERRORED"
        return Verdict("run-finished", "expected" if ok else "fail",
                       "the run ended in a clean failure (ERRORED), as budget exhaustion should" if ok else
                       f"run finished as {state}, but budget exhaustion should end it ERRORED", None, evidence)
    if state == "FINISHED":
        return Verdict("run-finished", "pass", "the run finished (FINISHED)", None, evidence)
    return Verdict("run-finished", "fail", f"run failed: ended {state}: {evidence['error']}", "run failed", evidence)


# -- healed ----------------------------------------------------------------------------
def healed(nodes_ok: bool, nodes_detail: str, armed: list[dict], resources_ok: bool, resources_detail: str) -> Verdict:
    problems = []
    if not nodes_ok:
        problems.append(nodes_detail)
    if armed:
        problems.append(f"{len(armed)} fault(s) still armed: " + ", ".join(f"{a['fault']}@{a['id']}" for a in armed))
    if not resources_ok:
        problems.append(resources_detail)
    evidence = {"nodes": nodes_detail, "armed": armed, "resources": resources_detail}
    if problems:
        return Verdict("healed", "fail", "cleanup failed: " + "; ".join(problems), "cleanup failed", evidence)
    return Verdict("healed", "pass", f"{nodes_detail}; no fault armed; {resources_detail}", None, evidence)


# -- all of it -------------------------------------------------------------------------
def verdicts_for(timeline: Timeline, expect: Expectation) -> list[Verdict]:
    return [*resumed_from_latest(timeline), within_budget(timeline, expect), *recovery_time(timeline, expect),
            run_finished(timeline, expect)]


def check(verdicts: list[Verdict]) -> None:
    """Raise VerificationError listing every failed verdict (first failure's diagnosis leads)."""
    failed = [v for v in verdicts if v.failed]
    if failed:
        raise VerificationError("\n".join(v.message for v in failed), verdicts)

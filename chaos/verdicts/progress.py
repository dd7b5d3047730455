"""The findings reached while waiting on a run (chaos.progress's StallWatch, the
experiment's deadlines): it stalled, did not resume, loops, or ended too early."""

from __future__ import annotations

from typing import Any

from chaos.attribution import CAPACITY_ERRORS
from chaos.timeline import Event, latest_run, steps_of
from chaos.verdicts.diagnosis import Diagnosis
from chaos.verdicts.status import Status
from chaos.verdicts.verdict import Verdict

NAME = "progress"


def last_steps(events: list[Event]) -> dict[int, Any]:
    """Each rank's last reported step (over every run and attempt)."""
    out: dict[int, Any] = {}
    for r in events:
        if r.kind == "report":
            out.update(steps_of(r))
    return out


def stalled(events: list[Event], quiet_s: float, limit_s: float, waiting_for: str) -> Verdict:
    """The run stopped reporting: a finding about the run, not a harness error."""
    steps = last_steps(events)
    ranks = ", ".join(f"rank {r} at step {s}" for r, s in sorted(steps.items())) or "no rank had reported"
    return Verdict(NAME, Status.FAIL, f"training stalled: no rank reported for {quiet_s:.0f} s (stall limit "
                   f"{limit_s:.0f} s) while waiting for {waiting_for}; last steps: {ranks}",
                   Diagnosis.TRAINING_STALLED,
                   {"quiet_s": quiet_s, "stall_limit_s": limit_s, "last_steps": steps, "waiting_for": waiting_for})


def did_not_resume(what: str, detail: str) -> Verdict:
    """Ray never noticed the fault, or never restarted after it."""
    return Verdict(NAME, Status.FAIL, f"did not resume: {what} ({detail})", Diagnosis.DID_NOT_RESUME,
                   {"awaited": what, "detail": detail})


def ended_before_fault(fault: int, trigger: str, ended: Event) -> Verdict:
    """The run ended before a fault's trigger fired: nothing of that fault can be judged,
    and that is the finding (a run too short for its faults, or one that ended early)."""
    return Verdict(NAME, Status.FAIL, f"run ended before the fault: fault {fault} waited {trigger}, but "
                   f"{ended.describe()} came first; no fault {fault} was injected", Diagnosis.ENDED_BEFORE_FAULT,
                   {"fault": fault, "trigger": trigger, "ended": ended.to_json()})


def _limited(limit: Any) -> bool:
    """A decision's limit that ends retries: a number >= 0 (Ray logs inf, -1 or nothing for unlimited)."""
    try:
        return 0 <= float(limit) < float("inf")
    except (TypeError, ValueError):
        return False


def _error_line(text: str | None) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return (lines[-1] if lines else "no error text")[:300]


def crash_loop(events: list[Event], failures: int) -> Verdict | None:
    """``failures`` failure decisions in a row, each retried under an unlimited budget, with
    no step beyond the best one before them: Ray would retry forever (max_failures=-1)."""
    latest = latest_run(events)
    mine = [e for e in events if e.data.get("run_id") == latest]
    loop = [e for e in mine if e.kind == "failure_decision" and e.data.get("decision") == "RETRY"
            and not set(e.data.get("error_types") or ()) & set(CAPACITY_ERRORS)]
    if failures < 1 or len(loop) < failures:
        return None
    streak = loop[-failures:]
    if any(_limited(d.data.get("limit")) for d in streak):
        return None  # a finite budget ends the loop by itself: within-budget judges it
    stepped = [(e.t, max(steps_of(e).values())) for e in mine if e.kind == "report" and steps_of(e)]
    best = max((s for t, s in stepped if t < streak[0].t), default=None)
    if any(best is None or s > best for t, s in stepped if t >= streak[0].t):
        return None
    errors = "; ".join(dict.fromkeys(_error_line(d.data.get("error")) for d in streak))
    return Verdict(NAME, Status.FAIL, f"crash loop: {failures} failures in a row without a step beyond "
                   f"{best if best is not None else 'the start'}, each retried (unlimited budget): {errors}",
                   Diagnosis.CRASH_LOOP, {"decisions": [{"t": d.t, "attempt": d.attempt,
                                                         "error_types": d.data.get("error_types")} for d in streak],
                                          "best_step": best})

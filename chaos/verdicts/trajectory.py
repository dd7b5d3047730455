"""state-trajectory: every report of the run the faults hit, step by step and rank by rank,
reproduces the fault-free run's state at the same step (the state metric within the suite's
tolerance, digests exactly).  A restore that brought the step back but not the optimizer,
scheduler, RNG or data position leaves the trajectory at the first step that depends on the
lost part — a step the state-restored verdict (re-done steps only) may never see.  A run that
left the baseline *before* any fault does not reproduce it at all: unverifiable, not judged.

An elastic run follows the baseline only while it trains at the baseline's world size from a
state on the baseline's path: an attempt at another size began from such a state (its first
report's ``digest_<part>`` compare) and leaves the path at its first update; an attempt that
began from a checkpoint committed off the path is not followed at all (unverifiable, naming
the world sizes) — never blamed on the restore."""

from __future__ import annotations

import dataclasses
from typing import Any

from chaos.timeline import Timeline
from chaos.verdicts.diagnosis import Diagnosis
from chaos.verdicts.expect import Expect
from chaos.verdicts.resume_rank import DETERMINISM_HINT
from chaos.verdicts.states import (
    DIGEST_PARTS,
    PART_CAUSES,
    STATE_DIGEST_METRICS,
    TRAJECTORY_METRICS,
    UPDATED_DIGESTS,
    Baseline,
    baseline_path,
    baseline_unusable,
    comparable,
    faulted_run_events,
    faulted_run_reports,
    fmt,
    rank_states,
    sums_reorder,
)
from chaos.verdicts.status import Status
from chaos.verdicts.tolerance import STATE_ATOL, same_state, step_key
from chaos.verdicts.verdict import Verdict

NAME = "state-trajectory"


class StateTrajectory:
    name = NAME
    judges_a_stopped_run = True

    def applies(self, expect: Expect) -> bool:
        return expect.baseline

    def check(self, timeline: Timeline, expect: Expect) -> list[Verdict]:
        if expect.reference is None:  # asked for, never made: said, not left out
            return [Verdict(NAME, Status.UNVERIFIABLE, "unverifiable: no baseline: the suite asked to follow the run "
                            "against a fault-free run (baseline=True, --chaos-baseline), but none was made",
                            Diagnosis.NO_BASELINE)]
        return [state_trajectory(timeline, expect.reference, expect)]


@dataclasses.dataclass
class _Followed:
    compared: list[dict[str, Any]]
    first_off: dict[str, Any] | None  # the first report after the fault that left the baseline
    off_before: dict[str, Any] | None  # the first that left it before any fault
    first_attempt: int
    attempts_after: set[int]  # the attempts after the first that reported
    stateless: bool  # the run's reports carry no state at all
    off_path: dict[int, str] = dataclasses.field(default_factory=dict)  # attempt -> why the baseline cannot follow it


def _same(a: Any, b: Any, rtol: float) -> bool:
    return same_state(a, b, rtol) if isinstance(a, (int, float)) else bool(a == b)


def _follow(timeline: Timeline, baseline: Baseline, rtol: float) -> _Followed:
    reports, metric = faulted_run_reports(timeline)
    fault = timeline.first("fault_injected")
    base = {rank: {step_key(step): state for step, state in rows} for rank, rows in baseline.trajectory.items()}
    first_attempt = min((r.attempt for r in reports if r.attempt is not None), default=0)
    out = _Followed([], None, None, first_attempt, {r.attempt for r in reports if r.attempt is not None
                                                    and r.attempt > first_attempt}, True)
    path = baseline_path(timeline)
    out.off_path = {a: why for a, (_, why) in path.items() if why}
    pristine = _restored_from_the_first_attempt(timeline, first_attempt)
    sizes = {e.attempt: len(e.data.get("placement") or []) or None for e in faulted_run_events(timeline)
             if e.kind == "attempt_started"}
    seen: set[tuple[int | None, int]] = set()
    for r in reports:
        for rank, (step, state) in rank_states(r, metric, TRAJECTORY_METRICS).items():
            out.stateless = out.stateless and not state
            want = base.get(rank, {}).get(step_key(step)) or {}
            allowed = _comparable(path.get(r.attempt) if r.attempt is not None else None, (r.attempt, rank) in seen)
            inexact = (_inexact(r.attempt, first_attempt, (r.attempt, rank) not in seen and r.attempt in pristine)
                       if sums_reorder(sizes.get(r.attempt)) else set())
            common = sorted(m for m in set(state) & set(want) if (allowed is None or m in allowed)
                            and m not in inexact and comparable(want[m]))
            seen.add((r.attempt, rank))
            if not common:
                continue
            bad = [m for m in common if not _same(state[m], want[m], rtol)]
            row = {"attempt": r.attempt, "rank": rank, "step": step, "metrics": common, "differ": bad,
                   "got": {m: state[m] for m in bad}, "baseline": {m: want[m] for m in bad},
                   "after_fault": fault is not None and r.t >= fault.t}
            out.compared.append(row)
            if bad and not row["after_fault"] and out.off_before is None:
                out.off_before = row
            if bad and row["after_fault"] and out.first_off is None:
                out.first_off = row
    return out


def _restored_from_the_first_attempt(timeline: Timeline, first_attempt: int) -> set[int]:
    """The attempts that began from scratch or from a checkpoint the first attempt committed:
    their first report's began state is the uninterrupted run's, bit for bit."""
    out: set[int] = set()
    last: int | None = None
    for e in faulted_run_events(timeline):
        if e.kind == "report" and e.data.get("checkpoint"):
            last = e.attempt
        elif e.kind == "attempt_started" and e.attempt is not None and last in (None, first_attempt):
            out.add(e.attempt)
    return out


def _inexact(attempt: int | None, first_attempt: int, restored_first: bool) -> set[str]:
    """The digests a report cannot match the baseline's bit for bit (states.UPDATED_DIGESTS):
    in a restarted attempt every float digest but those of a state restored from the first
    attempt's, and the state after a restarted attempt's update always."""
    if attempt is None or attempt == first_attempt:
        return set()
    return set(STATE_DIGEST_METRICS) if restored_first else set(UPDATED_DIGESTS)


def _comparable(path: tuple[str, str] | None, seen_before: bool) -> set[str] | None:
    """The metrics a report may be compared on (None: every one); off an elastic run's path
    only a first report's began digests, else none."""
    if path is None or path[0] == "whole":
        return None
    if path[0] == "first" and not seen_before:
        return {m for m in TRAJECTORY_METRICS if m not in STATE_DIGEST_METRICS}
    return set()


def state_trajectory(timeline: Timeline, baseline: Baseline, expect: Expect | None = None) -> Verdict:
    expect = expect or Expect()
    rtol = expect.rtol
    f = _follow(timeline, baseline, rtol)
    origin = baseline.origin()
    evidence = {"baseline_key": baseline.key, "rtol": rtol, "atol": STATE_ATOL, "compared": len(f.compared),
                "first_divergence": f.first_off, "before_the_fault": f.off_before}
    unusable = baseline_unusable(timeline, baseline)
    if unusable:
        return Verdict(NAME, Status.UNVERIFIABLE, unusable, Diagnosis.NO_BASELINE, evidence)
    if f.stateless:
        return Verdict(NAME, Status.UNVERIFIABLE, "unverifiable: no state metric: the run's reports carry no state "
                       "value (--chaos-state-metric, or digest_<part> metrics), so its trajectory cannot be followed",
                       Diagnosis.NO_STATE_METRIC, evidence)
    if f.off_before is not None:
        return Verdict(NAME, Status.UNVERIFIABLE, f"unverifiable: baseline not reproduced: {_divergence(f.off_before)} "
                       "before any fault was injected, so the workload does not reproduce its fault-free run at rtol "
                       f"{rtol:g} and nothing after the fault can be blamed on the restore (seed every source of "
                       "randomness, or allow more with --chaos-state-rtol)", Diagnosis.BASELINE_NOT_REPRODUCED,
                       evidence)
    if f.first_off is not None:
        return _left(f.first_off, origin, expect, evidence)
    return _followed(f, origin, rtol, evidence)


def _left(row: dict[str, Any], origin: str, expect: Expect, evidence: dict[str, Any]) -> Verdict:
    what = f"{_divergence(row)} ({origin})"
    parts = [p for p in DIGEST_PARTS if f"digest_{p}" in row["differ"]]
    why = (PART_CAUSES[parts[0]] + (f" (digest_{parts[0]} differs" + (
        f"; so does {', '.join('digest_' + p for p in parts[1:])}" if parts[1:] else "") + ")")
        if parts else "usually the optimizer's or LR scheduler's state, the RNG or the data position was not restored")
    if expect.is_deterministic:
        return Verdict(NAME, Status.FAIL, f"state not restored: {what}: {why}", Diagnosis.STATE_NOT_RESTORED, evidence)
    return Verdict(NAME, Status.WARNING, f"state differs: {what}: {why} — a warning, not a failure: the workload is "
                   f"not declared deterministic ({DETERMINISM_HINT})", Diagnosis.STATE_DIFFERS, evidence)


def _followed(f: _Followed, origin: str, rtol: float, evidence: dict[str, Any]) -> Verdict:
    restarted = [c for c in f.compared if c["attempt"] > f.first_attempt]
    unfollowed = sorted(f.attempts_after - {c["attempt"] for c in restarted})
    if f.off_path:
        evidence["off_the_baselines_path"] = f.off_path
    resized = "".join(f"; attempt {a}: {f.off_path[a]}" for a in unfollowed if a in f.off_path)
    if restarted and unfollowed:  # one attempt's steps do not vouch for another's
        return Verdict(NAME, Status.UNVERIFIABLE, f"unverifiable: no step to compare in attempt(s) "
                       f"{', '.join(map(str, unfollowed))}: they reported no step the fault-free run reported with a "
                       f"state value{' at its world size' if resized else ''}, so their restored state is not "
                       f"followed ({origin}){resized}", Diagnosis.NO_STEP_TO_COMPARE, evidence)
    if not restarted:
        if not f.attempts_after:
            return Verdict(NAME, Status.NOT_APPLICABLE, "not checked: no attempt after the first reported, so no "
                           "restored state to follow", None, evidence)
        return Verdict(NAME, Status.UNVERIFIABLE, "unverifiable: no step to compare: the restarted attempts reported "
                       f"no step the fault-free run reported with a state value ({origin}){resized}",
                       Diagnosis.NO_STEP_TO_COMPARE, evidence)
    thin = _followed_at_one_step(restarted)
    if thin:
        return Verdict(NAME, Status.UNVERIFIABLE, f"unverifiable: too few steps followed: attempt(s) "
                       f"{', '.join(map(str, thin))} reported one step the fault-free run has, its first after the "
                       "restore, whose state value is computed before any update and so shows the weights alone: the "
                       "optimizer, scheduler, data position and RNG show only from the second step (let the fault "
                       f"land earlier in the run, or report digest_<part> metrics; {origin})",
                       Diagnosis.TOO_FEW_FOLLOWED, evidence)
    steps = sorted({c["step"] for c in restarted})
    metrics = sorted({m for c in restarted for m in c["metrics"]})
    return Verdict(NAME, Status.PASS, f"{len(restarted)} report(s) of the restarted attempt(s) at steps "
                   f"{fmt(steps[0])}..{fmt(steps[-1])} followed the fault-free trajectory ({', '.join(metrics)}; rtol "
                   f"{rtol:g}; {origin})", None, evidence)


def _followed_at_one_step(restarted: list[dict[str, Any]]) -> list[int]:
    """The restarted attempts followed at fewer than two steps, with no digest of the whole
    state compared: their one step shows only the weights (a step's loss comes before its
    update), as state-restored's single re-done step does."""
    by_attempt: dict[int, list[dict[str, Any]]] = {}
    for c in restarted:
        by_attempt.setdefault(c["attempt"], []).append(c)
    return sorted(a for a, rows in by_attempt.items() if len({step_key(c["step"]) for c in rows}) < 2
                  and not any(_whole_state(c["metrics"]) for c in rows))


def _whole_state(metrics: list[str]) -> bool:
    return bool(set(STATE_DIGEST_METRICS) & set(metrics)) or all(f"digest_{p}" in metrics for p in DIGEST_PARTS)


def _divergence(row: dict[str, Any]) -> str:
    values = ", ".join(f"{m} {fmt(row['got'][m])} but {fmt(row['baseline'][m])} in the baseline" for m in row["differ"])
    where = f"attempt {row['attempt']}, rank {row['rank']}"
    return f"step {fmt(row['step'])} ({where}) left the fault-free trajectory: {values}"

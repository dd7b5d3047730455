"""resumed-from-latest: after every restart, every rank began right after the latest
committed checkpoint (DESIGN §6).  One verdict per restart per Train run; each rank is
judged by chaos.verdicts.resume_rank, the ranks' judgements merged here."""

from __future__ import annotations

from typing import Any

from chaos.timeline import Event, Timeline, faulted_runs, runs
from chaos.train.recording import AUTO_STEP_METRICS
from chaos.verdicts.diagnosis import Diagnosis
from chaos.verdicts.expect import Expect
from chaos.verdicts.gaps import gap_before, judged_despite_the_gap
from chaos.verdicts.reports import Row, RunReports
from chaos.verdicts.resume_rank import SEVERITY, Judgement, judge_late_step, judge_rank
from chaos.verdicts.status import Status
from chaos.verdicts.verdict import Verdict

NAME = "resumed-from-latest"


class ResumedFromLatest:
    name = NAME
    judges_a_stopped_run = True

    def applies(self, expect: Expect) -> bool:
        return True

    def check(self, timeline: Timeline, expect: Expect) -> list[Verdict]:
        return resumed_from_latest(timeline, expect)


def resumed_from_latest(timeline: Timeline, expect: Expect | None = None) -> list[Verdict]:
    """One verdict per restart per run: did every rank resume right after the latest
    checkpoint?  The fault-free baseline (``expect.trajectory``) decides a resume at a
    checkpoint's own step where no earlier attempt reported the step after it."""
    expect = expect or Expect()
    all_runs, hit = runs(timeline), faulted_runs(timeline)
    verdicts = []
    for i, (run_id, events) in enumerate(all_runs, 1):
        label = f"run {i}, " if len(all_runs) > 1 else ""
        baseline = expect.trajectory if hit and run_id == hit[-1] else None
        verdicts += _resumes_of_run(timeline, run_id, events, label, RunReports(events, expect, baseline))
    return verdicts


def _resumes_of_run(timeline: Timeline, run_id: str, events: list[Event], label: str,
                    run: RunReports) -> list[Verdict]:
    if len(run.attempts) < 2:
        return []
    refused = _unjudgeable(run, run_id, label)
    if refused is not None:
        return [refused]
    starts = {int(e.data["attempt"]): e for e in events
              if e.kind == "attempt_started" and e.data.get("attempt") is not None}
    verdicts: list[Verdict] = []
    silent: list[int] = []
    for attempt in run.attempts[1:]:
        name = f"{NAME} ({label}attempt {attempt})"
        first = run.first_of(attempt)
        if first is None:
            reported = run.of_attempt(attempt)
            if reported:  # it trained and reported, but nothing says where it began
                verdicts.append(_stepless(name, run_id, attempt, reported, run))
                silent = []
            else:
                silent.append(attempt)  # never reported (failed while starting, or the run ended): judged by others
            continue
        verdict = _judge_attempt(run, run_id, name, attempt, first, silent, events)
        gap = gap_before(timeline, run_id, attempt, first.event, [c.event for c in run.commits_before(attempt)],
                         starts)
        verdicts.append(verdict if gap is None else judged_despite_the_gap(verdict, *gap, attempt))
        silent = []
    return verdicts


def _unjudgeable(run: RunReports, run_id: str, label: str) -> Verdict | None:
    """Why none of the run's restarts can be judged (no step, no checkpoint, a step that goes
    back), else None."""
    name = f"{NAME} ({label}run)"
    if not run.stepped:
        return _no_step_metric(run, run_id, name)
    if not any(r.checkpoint for r in run.rows):
        return Verdict(name, Status.UNVERIFIABLE, "unverifiable: the run reported no checkpoint to Ray Train, so no "
                       "restart can be judged (a script that saves checkpoints itself must also pass them to "
                       "ray.train.report)", Diagnosis.NO_CHECKPOINT_REPORTED,
                       {"reports": len(run.rows), "run_id": run_id})
    back = run.going_back()
    if back is None:
        return None
    attempt, rank, prev, step = back
    metric = run.step_metric()
    return Verdict(name, Status.UNVERIFIABLE, f"unverifiable: step metric {metric!r} goes back: rank {rank} reported "
                   f"step {prev}, then {step} in attempt {attempt}; a counter that resets (an epoch-local step) cannot "
                   "tell a resume from a fresh start: report a step that only grows (e.g. global_step) and name it "
                   "with --chaos-step-metric", Diagnosis.STEP_GOES_BACK,
                   {"run_id": run_id, "attempt": attempt, "rank": rank, "step_metric": metric, "steps": [prev, step]})


def _no_step_metric(run: RunReports, run_id: str, name: str) -> Verdict:
    refused = next((r.data.step_refused for r in run.rows if r.data.step_refused), None)
    metric = run.step_metric()
    if refused:
        rank, what = next(iter(refused.items()))
        return Verdict(name, Status.UNVERIFIABLE, f"unverifiable: step not a number: rank {rank} reported the step "
                       f"metric as {what}, a string that is no number, so no restart can be judged (report the step "
                       "as an int)", Diagnosis.STEP_NOT_A_NUMBER,
                       {"reports": len(run.rows), "step_refused": refused, "run_id": run_id})
    names = ", ".join(repr(n) for n in metric.split(", "))
    return Verdict(name, Status.UNVERIFIABLE, f"unverifiable: no step metric {names} in the run's reports; pass "
                   "--chaos-step-metric with the metric your script reports", Diagnosis.NO_STEP_METRIC,
                   {"reports": len(run.rows), "step_metric": names, "run_id": run_id})


def _judge_attempt(run: RunReports, run_id: str, name: str, attempt: int, first: Row, silent: list[int],
                   events: list[Event]) -> Verdict:
    commits = run.commits_before(attempt)
    judged = [judge_rank(run, rank, got, commits, attempt) for rank, got in sorted(first.steps.items())]
    late = sorted(run.ranks_in(attempt) - set(first.steps))  # their first report carried no step
    judged += [judge_late_step(run, rank, commits, attempt) for rank in late]
    latest = commits[-1] if commits else None
    ck_step = latest.steps.get(0, latest.data.step) if latest is not None else None
    if ck_step is None and judged and judged[0].status is Status.PASS:  # a step-less commit, read by the rule
        ck_step = judged[0].checkpoint_step
    evidence = {
        "run_id": run_id, "attempt": attempt, "attempts_that_never_reported": list(silent),
        "latest_checkpoint": latest.checkpoint if latest else None,
        "latest_checkpoint_step": ck_step,
        "committed_steps": [c.data.step for c in commits],
        "first_step_of_attempt": first.data.step,
        "first_steps_of_run": {rank: run.run_first_step(rank, attempt) for rank in sorted(first.steps)},
        "reporting_stride": {rank: s.regular if s.regular is not None else list(s.seen)
                             for rank, s in run.strides_before(attempt).items()},
        "step_sources": first.data.step_sources,
        "ranks": {j.rank: j.to_json() for j in judged},
    }
    verdict = _combine(name, attempt, judged, latest, run.ranks_agreed_before(attempt), evidence)
    note = _renamed_resubmission(events, first) if verdict.diagnosis is Diagnosis.RESTARTED_FROM_SCRATCH else None
    if note:
        verdict.message += f"; {note}"
        verdict.evidence["renamed_run"] = note
    return verdict


def _combine(name: str, attempt: int, judged: list[Judgement], latest: Row | None, agreed: bool,
             evidence: dict[str, Any]) -> Verdict:
    status = Status.merge(j.status for j in judged)
    ck_desc = (f"checkpoint step {judged[0].checkpoint_step} was committed ({latest.checkpoint})"
               if latest is not None else "no checkpoint existed")
    if status is Status.FAIL:
        return _failed(name, attempt, judged, latest, ck_desc, evidence)
    # a rank whose first report had no step began at a step nobody saw
    starts = {j.rank: j.got for j in judged if j.got is not None and j.diagnosis is not Diagnosis.NO_STEP_AFTER_RESTART}
    if len(set(starts.values())) > 1 and agreed:
        evidence["rule"] = "ranks reported the same step before the restart"
        parts = ", ".join(f"rank {r} at step {s}" for r, s in starts.items())
        return Verdict(name, Status.FAIL, f"ranks disagree: after the restart attempt {attempt} began with {parts}, "
                       "although the ranks reported the same steps before it", Diagnosis.RANKS_DISAGREE, evidence)
    lead = next(j for j in judged if j.status is status)
    evidence["rule"] = lead.rule
    if status is Status.UNVERIFIABLE:
        return Verdict(name, status, f"unverifiable: attempt {attempt}, rank {lead.rank}: {lead.why}", lead.diagnosis,
                       evidence)
    if status is Status.WARNING:
        return Verdict(name, status, f"state differs: attempt {attempt}, rank {lead.rank} began at the checkpoint's "
                       f"own step {lead.got}, and {lead.why}", Diagnosis.STATE_DIFFERS, evidence)
    return _passed(name, attempt, judged, latest, evidence)


def _failed(name: str, attempt: int, judged: list[Judgement], latest: Row | None, ck_desc: str,
            evidence: dict[str, Any]) -> Verdict:
    failed = sorted((j for j in judged if j.status is Status.FAIL),
                    key=lambda j: SEVERITY.index(j.diagnosis) if j.diagnosis in SEVERITY else len(SEVERITY))
    ok = [j for j in judged if j.status is Status.PASS]
    lead = failed[0]
    evidence["rule"] = lead.rule
    every = " on every rank" if len(judged) > 1 else ""
    diagnosis = lead.diagnosis or Diagnosis.UNEXPECTED_STEP
    if len(failed) == len(judged) and len({j.got for j in judged}) == 1:
        head = f"{diagnosis.value}: attempt {attempt} began at step {lead.got}{every}"
        head += f" although {ck_desc} ({lead.why})" if latest is not None else f" ({lead.why})"
    else:
        bad = ", ".join(f"rank {j.rank} began attempt {attempt} at step {j.got} ("
                        + (f"{j.diagnosis.value}: " if j.diagnosis and j.diagnosis != diagnosis else "")
                        + f"{j.why})" for j in failed)
        head = f"{diagnosis.value}: {bad}"
        if ok:
            head += " while " + ", ".join(f"rank {j.rank} resumed at {j.got}" for j in ok)
        if latest is not None:
            head += f"; {ck_desc}"
    return Verdict(name, Status.FAIL, f"{head} (rule: {lead.rule})", diagnosis, evidence)


def _passed(name: str, attempt: int, judged: list[Judgement], latest: Row | None,
            evidence: dict[str, Any]) -> Verdict:
    j = judged[0]
    every = f" on every rank ({len(judged)})" if len(judged) > 1 else ""
    if latest is None:
        return Verdict(name, Status.PASS, f"no checkpoint existed yet: attempt {attempt} correctly started from step "
                       f"{j.got}{every}", None, evidence)
    if j.got == j.checkpoint_step and j.expected != j.got:
        how = (f"at the latest checkpoint's own step ({j.checkpoint_step}), evaluating after loading it: the "
               "step trained after it reproduced its earlier value")
    else:
        how = f"right after the latest checkpoint (step {j.checkpoint_step})"
    return Verdict(name, Status.PASS, f"attempt {attempt} resumed at step {j.got}, {how}{every} (rule: {j.rule})",
                   None, evidence)


def _stepless(name: str, run_id: str, attempt: int, reported: list[Row], run: RunReports) -> Verdict:
    """A resumed attempt that reported without a step: never a pass, and never skipped."""
    metric = run.step_metric()
    keys = sorted({k for r in reported for k in r.data.metrics})
    renamed = [k for k in keys if k in AUTO_STEP_METRICS and k != metric]
    msg = (f"unverifiable: attempt {attempt} reported {len(reported)} time(s) without the step metric {metric!r} "
           f"(it reported {', '.join(repr(k) for k in keys) or 'no metrics'})")
    if renamed:
        msg += f"; the step metric changed name between attempts: {metric!r} before, {renamed[0]!r} now"
    return Verdict(name, Status.UNVERIFIABLE, msg, Diagnosis.NO_STEP_AFTER_RESTART,
                   {"run_id": run_id, "attempt": attempt, "reports": len(reported), "metrics": keys,
                    "step_metric": metric})


def _renamed_resubmission(events: list[Event], first: Row) -> str | None:
    """A resubmitted job that started a Train run of another name or storage (a timestamp in
    its RunConfig name): a new run in a new folder, with nothing to resume from — said, with
    the fix."""
    starts = [e for e in events if e.kind == "controller_started"]
    lost = next((e for e in starts if not e.data.get("train_run_id")), None)
    again = next((e for e in reversed(starts) if e.data.get("train_run_id") and e.t <= first.t), None)
    if lost is None or again is None:
        return None

    def where(e: Event) -> tuple[Any, Any]:
        return e.data.get("run_name"), e.data.get("storage_path")

    if where(lost) == where(again):
        return None
    return (f"the resubmitted job started Train run {where(again)[0]!r} (storage {where(again)[1]}), the lost job's "
            f"was {where(lost)[0]!r} (storage {where(lost)[1]}): a run name that changes per job (a timestamp in "
            "RunConfig(name=...)) starts a new run in a new folder instead of resuming the old one; give RunConfig "
            "a name that is stable across job retries")

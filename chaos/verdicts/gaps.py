"""Events the harness never saw: the unread end of a lost job's events log
(``events_unread``) and events the recorder numbered but could not write (``events_lost``).
A verdict judged across such a gap may be missing the evidence that decides it."""

from __future__ import annotations

from chaos.timeline import Event, Timeline, faulted_runs
from chaos.verdicts import events
from chaos.verdicts.diagnosis import Diagnosis
from chaos.verdicts.status import Status
from chaos.verdicts.verdict import Verdict

#: what events the harness did not see cannot turn into a right resume: a later checkpoint than
#: the latest one seen, or an earlier first report of the attempt, only make these worse (and
#: ranks that disagree did so within one report round)
WRONG_WHATEVER_WAS_UNREAD = (Diagnosis.RESTARTED_FROM_SCRATCH, Diagnosis.OLDER_CHECKPOINT, Diagnosis.RANKS_DISAGREE)


def gap_before(timeline: Timeline, run_id: str, attempt: int, first: Event, commits: list[Event],
               starts: dict[int, Event]) -> tuple[Event, bool] | None:
    """A gap in the run's events that leaves unknown where ``attempt`` began or the latest
    checkpoint before it, and whether its beginning may be in it: the unread end of a lost
    job's events log (one before the attempt, with no checkpoint committed since), or events
    the recorder could not write (the attempt's first report read after them, its start not
    read after them or no checkpoint read since)."""
    for gap in reversed(timeline.of("events_unread", source="harness")):
        unread = events.EventsUnread.model_validate(gap.data)
        since = unread.next_attempt
        if unread.run_id == run_id and since is not None and since <= attempt:
            if not any(c.attempt is not None and c.attempt >= since for c in commits):
                return gap, False
            break
    for gap in timeline.of("events_lost", source="harness"):
        lost = events.EventsLost.model_validate(gap.data)
        after = lost.before_t  # the first event read after the lost ones
        if lost.run_id != run_id or after is None or first.t < after:
            continue
        start = starts.get(attempt)
        if start is None or start.t < after:
            return gap, True
        if not any(c.t >= after for c in commits):
            return gap, False
    return None


def missing(gap: Event) -> str:
    if gap.kind == "events_lost":
        lost = events.EventsLost.model_validate(gap.data)
        first, last = lost.seqs or ("?", "?")
        return (f"the recorder could not write events {first}..{last} of job {lost.job_id}'s events log "
                "(the Train controller's log says why)")
    unread = events.EventsUnread.model_validate(gap.data)
    return f"the events log of job {unread.job_id}, whose driver was lost, could not be read to its end ({unread.why})"


def diagnosis_of(gap: Event) -> Diagnosis:
    return Diagnosis.EVENTS_LOST if gap.kind == "events_lost" else Diagnosis.EVENTS_UNREAD


def judged_despite_the_gap(verdict: Verdict, gap: Event, start_unseen: bool, attempt: int) -> Verdict:
    """A resume judged on the events read, where a gap may hold a later checkpoint (or the
    attempt's real first report): a pass (or a resume past the seen checkpoint) proves nothing.
    The judgement on what was read stays in the evidence only: its diagnosis phrase in the
    message would file the test under that diagnosis in the report."""
    if verdict.status is Status.FAIL and verdict.diagnosis in WRONG_WHATEVER_WAS_UNREAD:
        return verdict
    seen, got = verdict.evidence.get("latest_checkpoint_step"), verdict.evidence.get("first_step_of_attempt")
    lost = gap.kind == "events_lost"
    diagnosis = diagnosis_of(gap)
    evidence = {**verdict.evidence, gap.kind: gap.data,
                "judged_on_what_was_read": {"status": verdict.status.value, "message": verdict.message}}
    after = f" after step {seen}" if seen is not None else ""
    committed = f"a checkpoint {'' if lost else 'it '}committed{after}"
    hidden = f"attempt {attempt}'s first report" if start_unseen else committed
    hint = ("give the Ray logs directory of the controller's node room (a full disk there loses events)" if lost
            else "keep the head's Ray logs directory across its restarts, e.g. a volume at /tmp/ray, so the "
                 "harness can read it")
    return Verdict(verdict.name, Status.UNVERIFIABLE,
                   f"{diagnosis.value}: {missing(gap)}, so {hidden} would be missing and attempt {attempt}'s "
                   f"start at step {got} cannot be judged (the evidence holds the judgement on what was read alone; "
                   f"{hint})", diagnosis, evidence)


def decisions_gap(timeline: Timeline) -> Event | None:
    """Events of a faulted run nobody read or the recorder could not write: a failure
    decision may be among them."""
    hit = set(faulted_runs(timeline))
    return next((g for g in timeline.events if g.source == "harness" and g.kind in ("events_unread", "events_lost")
                 and g.data.get("run_id") in hit), None)

"""state-restored: a step re-done after a restart reproduces what the earlier attempt
reported for it (the state metric within the suite's tolerance; the state digests a
workload reports, exactly).

A re-done step's loss is computed before any update, so the first re-done step shows the
weights (and the batch) the restart began from, and only the steps after it the optimizer,
scheduler, data position and RNG.  A workload declared deterministic that re-did fewer than
two steps has therefore shown only part of its state: the state-trajectory verdict follows it
against a fault-free baseline instead (chaos.pytest_plugin.Chaos.run makes one then), and without one this
verdict is unverifiable — never a pass on a weights-only check.

Across an elastic run's world-size change (the earlier attempt ran another number of ranks)
only the digests of the state the first re-done step began from compare: a rank's batch may
follow the world size and every update averages over it, so its loss, its whole-state digest
after the step and every later step legitimately differ.  The state a checkpoint saved
compares at any size.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from chaos.timeline import Event, Timeline, runs
from chaos.verdicts.diagnosis import Diagnosis
from chaos.verdicts.expect import Expect
from chaos.verdicts.reports import Row, RunReports
from chaos.verdicts.resume_rank import DETERMINISM_HINT
from chaos.verdicts.states import (
    AFTER_THE_FIRST_STEP,
    DIGEST_PARTS,
    PART_CAUSES,
    STATE_DIGEST_METRICS,
    UPDATED_DIGESTS,
    sums_reorder,
)
from chaos.verdicts.status import Status
from chaos.verdicts.tolerance import STATE_ATOL, same_step, step_in, step_key
from chaos.verdicts.verdict import Verdict

NAME = "state-restored"
DIGESTS = (*STATE_DIGEST_METRICS, *(f"digest_{p}" for p in DIGEST_PARTS))
BASELINE_HINT = ("--chaos-baseline, or chaos.expect(baseline=True): a fault-free run followed step by step; or let "
                 "the fault land a few steps after a checkpoint")


class StateRestored:
    name = NAME
    judges_a_stopped_run = True

    def applies(self, expect: Expect) -> bool:
        return True

    def check(self, timeline: Timeline, expect: Expect) -> list[Verdict]:
        return state_restored(timeline, expect)


@dataclasses.dataclass
class Compared:
    """One re-done report of one rank against the earlier one — or, ``against_checkpoint``,
    the state the restart's first step began from against the digests the checkpoint's
    report gave of the state it saved (``saved_digest_<part>``)."""

    rank: int
    step: Any
    value: float | None
    earlier: float | None
    earlier_attempt: int
    differ: list[str]  # the state metric and digests that did not reproduce
    digests: list[str]  # the digests compared
    against_checkpoint: Any = None  # the checkpoint's step
    world_sizes: tuple[int, int] | None = None  # (earlier, now) where an elastic run resized in between

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def state_restored(timeline: Timeline, expect: Expect | None = None) -> list[Verdict]:
    """Per restart per run: re-done steps reproduce the earlier attempt's state.  Only for runs
    that record a state; a value that does not reproduce fails a deterministic workload and is
    a warning for any other."""
    expect = expect or Expect()
    all_runs = runs(timeline)
    verdicts = []
    for i, (run_id, events) in enumerate(all_runs, 1):
        label = f"run {i}, " if len(all_runs) > 1 else ""
        run = RunReports(events, expect)
        refused = next((r for r in run.rows if r.data.state_refused), None)
        if refused is not None:
            verdicts.append(_refused(label, run_id, refused))
            continue
        if not any(r.data.states for r in run.rows):
            continue
        for attempt in sorted({r.attempt for r in run.rows if r.data.states})[1:]:
            verdicts.append(_judge_attempt(run, run_id, f"{NAME} ({label}attempt {attempt})", attempt, events))
    return verdicts


def _refused(label: str, run_id: str, refused: Row) -> Verdict:
    rank, why = next(iter((refused.data.state_refused or {}).items()))
    return Verdict(f"{NAME} ({label}run)", Status.UNVERIFIABLE,
                   f"unverifiable: no state metric: rank {rank} reported {why}, not a number, so no restored state "
                   "can be compared (report the loss as a float)", Diagnosis.NO_STATE_METRIC,
                   {"run_id": run_id, "refused": refused.data.state_refused})


def _compare(run: RunReports, attempt: int, events: list[Event]) -> list[Compared]:
    seen: dict[tuple[int, Any], Row] = {}
    for r in run.stepped:
        if r.attempt < attempt:
            for rank, step in r.steps.items():
                if r.value(rank) is not None or _digests(r, rank):
                    seen[(rank, step_key(step))] = r
    at_checkpoint = _first_reports_at_a_checkpoint(run, attempt)
    out, firsts = [], set()
    for r in (x for x in run.stepped if x.attempt == attempt):
        for rank, step in r.steps.items():
            first, was = rank not in firsts, seen.get((rank, step_key(step)))
            firsts.add(rank)
            if was is None or (id(r), rank) in at_checkpoint:
                continue
            row = _against(run, r, was, rank, step, first)
            if row is not None:
                out.append(row)
    return out


def _digests(row: Row, rank: int) -> dict[str, Any]:
    """The state digests ``rank`` reported in ``row`` (the recorder keeps the first rank's metrics)."""
    if rank != next(iter(row.data.steps or {}), None):
        return {}
    return {m: row.data.metrics[m] for m in DIGESTS if row.data.metrics.get(m) is not None}


def _against(run: RunReports, now: Row, was: Row, rank: int, step: Any, first: bool) -> Compared | None:
    resized = run.resized_between(was.attempt, now.attempt)
    if resized is not None:
        return _across_sizes(now, was, rank, step, resized) if first else None
    value, earlier = now.value(rank), was.value(rank)
    mine, theirs = _digests(now, rank), _digests(was, rank)
    # beyond two ranks exact only: the state the restart restored (the first step's began
    # digests) and the parts no update sums (states.UPDATED_DIGESTS); the rest by the tolerance
    exact = set(DIGESTS)
    if sums_reorder(run.world_size(now.attempt)):
        exact -= set(STATE_DIGEST_METRICS) if first else set(UPDATED_DIGESTS)
    digests = sorted(set(mine) & set(theirs) & exact)
    differ = [m for m in digests if mine[m] != theirs[m]]
    if value is None or earlier is None:
        value = earlier = None
        if not digests:
            return None
    elif not run.reproduces(value, earlier):
        differ.insert(0, "state")
    return Compared(rank, step, value, earlier, was.attempt, differ, digests)


def _across_sizes(now: Row, was: Row, rank: int, step: Any, sizes: tuple[int, int]) -> Compared | None:
    """The first re-done step of an attempt at another world size than the earlier report's:
    only the digests of the state the step began from (``digest_<part>``) compare."""
    mine, theirs = _digests(now, rank), _digests(was, rank)
    began = sorted(m for m in set(mine) & set(theirs) if m not in STATE_DIGEST_METRICS)
    if not began:
        return None
    return Compared(rank, step, None, None, was.attempt, [m for m in began if mine[m] != theirs[m]], began,
                    world_sizes=sizes)


def _against_the_checkpoint(run: RunReports, attempt: int) -> list[Compared]:
    """The state ``attempt``'s first step began from against the state the latest checkpoint
    saved, where the checkpoint's report gave its digests (the reference workload's
    ``saved_digest_<part>``): the whole restored state shown with no step re-done.  Only a first
    step after the checkpoint's own (one at or before it is the resume verdict's to judge)."""
    commits = run.commits_before(attempt)
    latest = commits[-1] if commits else None
    rank = next(iter(latest.data.steps or {}), None) if latest is not None else None
    if latest is None or rank is None or rank not in latest.steps:
        return []
    saved = {m.removeprefix("saved_"): v for m, v in latest.data.metrics.items() if m.startswith("saved_digest_")}
    first = run.first_step_of(attempt, rank)
    if not saved or first is None or not first[1] > latest.steps[rank]:
        return []
    began = _digests(first[0], rank)
    common = sorted(set(saved) & set(began))
    if not common:
        return []
    return [Compared(rank, first[1], None, None, latest.attempt, [m for m in common if began[m] != saved[m]], common,
                     latest.steps[rank])]


def _first_reports_at_a_checkpoint(run: RunReports, attempt: int) -> set[tuple[int, int]]:
    """(id of the report, rank) where ``rank``'s first report in ``attempt`` is at a step committed
    before it: an evaluation after loading that checkpoint, or that step trained again from
    it — both start from the state *after* the step, so neither can reproduce the value the
    earlier attempt reported *before* updating (resumed-from-latest judges it instead)."""
    committed: dict[int, set[Any]] = collections.defaultdict(set)
    firsts: dict[int, Row] = {}
    for r in run.stepped:
        for rank, step in r.steps.items():
            if r.attempt < attempt and r.checkpoint:
                committed[rank].add(step)
            elif r.attempt == attempt:
                firsts.setdefault(rank, r)
    return {(id(r), rank) for rank, r in firsts.items() if step_in(r.steps[rank], committed[rank])}


def _judge_attempt(run: RunReports, run_id: str, name: str, attempt: int, events: list[Event]) -> Verdict:
    compared = _compare(run, attempt, events) + _against_the_checkpoint(run, attempt)
    metric = _state_metric_of(run)
    evidence = {"run_id": run_id, "attempt": attempt, "compared": [c.to_json() for c in compared],
                "rtol": run.rtol, "atol": STATE_ATOL,
                "not_finite": sorted({f"rank {rank}: {what}" for r in run.rows if r.attempt <= attempt
                                      for rank, what in (r.data.state_nonfinite or {}).items()})}
    mismatched = [c for c in compared if c.differ]
    if mismatched:
        return _not_reproduced(run, name, attempt, compared, mismatched, metric, evidence)
    steps = sorted({step_key(c.step) for c in compared if c.against_checkpoint is None})
    whole = any(_whole_state(c.digests) for c in compared)
    resized = _resized_note(run, attempt)
    if run.expect.is_deterministic and len(steps) < 2 and not whole:
        return _too_few(run, name, attempt, steps, metric, evidence, resized)
    if not compared:
        return Verdict(name, Status.NOT_APPLICABLE, f"not checked: attempt {attempt} re-did no step that an earlier "
                       f"attempt had reported, so there is no {metric} to compare{resized}", None, evidence)
    if not any(c.digests or _moves(run, c, attempt) for c in compared):
        return _does_not_tell(run, name, attempt, metric, evidence)
    redone = [c for c in compared if c.against_checkpoint is None and c.world_sizes is None]
    shown = [f"{len(redone)} re-done report(s) reproduced the earlier attempt's {metric}"
             + (" and state digests" if any(c.digests for c in redone) else "")] if redone else []
    shown += [f"step {c.step} began from the state attempt {c.earlier_attempt} began it from ({', '.join(c.digests)})"
              for c in compared if c.world_sizes is not None]
    shown += [f"step {c.step} began from the state checkpoint step {c.against_checkpoint} saved "
              f"({', '.join(c.digests)})" for c in compared if c.against_checkpoint is not None]
    return Verdict(name, Status.PASS, "; ".join(shown) + resized, None, evidence)


def _resized_note(run: RunReports, attempt: int) -> str:
    """Where an elastic run changed its world size before ``attempt``: what that leaves comparable."""
    before = [a for a in run.attempts if a < attempt]
    sizes = run.resized_between(before[-1], attempt) if before else None
    if sizes is None:
        return ""
    return (f" (attempt {before[-1]} ran {sizes[0]} ranks, attempt {attempt} {sizes[1]}: across a world-size change "
            "a re-done step compares only by the state it began from, not by its loss nor any later step's)")


def _moves(run: RunReports, c: Compared, attempt: int) -> bool:
    """Whether the state metric moved, beyond the tolerance, between the compared step and the
    report before or after it (in the earlier attempt, or the restart's own): a value that
    does not move reproduces whatever state a restart began from."""
    if c.earlier is None:
        return False
    for a in (c.earlier_attempt, attempt):
        rows = [r for r in run.stepped if r.attempt == a and c.rank in r.steps and r.value(c.rank) is not None]
        at = next((i for i, r in enumerate(rows) if same_step(r.steps[c.rank], c.step)), None)
        near = [] if at is None else rows[max(at - 1, 0):at] + rows[at + 1:at + 2]
        if any(not run.reproduces(value, c.earlier) for r in near if (value := r.value(c.rank)) is not None):
            return True
    return False


def _does_not_tell(run: RunReports, name: str, attempt: int, metric: str, evidence: dict[str, Any]) -> Verdict:
    what = (f"attempt {attempt}'s re-done steps reproduced the earlier {metric}, but it did not move beyond the "
            f"tolerance (rtol {run.rtol:g}) between the reports around them, so any state would have reproduced it")
    if not run.expect.is_deterministic:
        return Verdict(name, Status.NOT_APPLICABLE, f"not checked: {what}", None, evidence)
    return Verdict(name, Status.UNVERIFIABLE, f"unverifiable: state metric does not tell the states apart: {what} "
                   "(report a state metric that moves with every step, or tighten --chaos-state-rtol)",
                   Diagnosis.STATE_DOES_NOT_TELL, evidence)


def _whole_state(digests: list[str]) -> bool:
    """Digests that cover every part of the state (a whole-state digest, or one per part)."""
    return bool(set(STATE_DIGEST_METRICS) & set(digests)) or all(f"digest_{p}" in digests for p in DIGEST_PARTS)


def _too_few(run: RunReports, name: str, attempt: int, steps: list[Any], metric: str,
             evidence: dict[str, Any], resized: str = "") -> Verdict:
    redone = (f"re-did only step {steps[0]}, whose {metric} is computed before any update and so shows the weights "
              "alone" if steps else "re-did no step an earlier attempt had reported") + resized
    if run.expect.trajectory is not None:
        return Verdict(name, Status.NOT_APPLICABLE, f"not decided here: attempt {attempt} {redone}; the "
                       "state-trajectory verdict follows it against the fault-free baseline", None, evidence)
    return Verdict(name, Status.UNVERIFIABLE, f"unverifiable: too few re-done steps: attempt {attempt} {redone}: the "
                   f"optimizer, scheduler, data position and RNG show only from the second re-done step, so the "
                   f"restored state of this deterministic workload is not shown ({BASELINE_HINT})",
                   Diagnosis.TOO_FEW_REDONE, evidence)


def _not_reproduced(run: RunReports, name: str, attempt: int, compared: list[Compared], mismatched: list[Compared],
                    metric: str, evidence: dict[str, Any]) -> Verdict:
    m = mismatched[0]
    mine = sorted((c for c in compared if c.rank == m.rank), key=lambda c: step_key(c.step))
    what = f"{_shown(m, mine, metric, attempt)} ({len(mismatched)} of {len(compared)} re-done reports differ)"
    if run.expect.is_deterministic:
        return Verdict(name, Status.FAIL, f"state not restored: {what}", Diagnosis.STATE_NOT_RESTORED, evidence)
    return Verdict(name, Status.WARNING, f"state differs: {what} — a warning, not a failure: the workload is not "
                   f"declared deterministic ({DETERMINISM_HINT}), and a data order or RNG it does not restore can "
                   "explain it", Diagnosis.STATE_DIFFERS, evidence)


def _shown(m: Compared, mine: list[Compared], metric: str, attempt: int) -> str:
    """What the evidence shows of the lost part: the first re-done step (before any update:
    the weights and the batch), the later ones (what the first update used), or the digests."""
    values = (f"{metric} {m.value:.6g}, but {m.earlier:.6g} in attempt {m.earlier_attempt}"
              if m.value is not None and m.earlier is not None else "its state digests differ")
    where = f"rank {m.rank} at re-done step {m.step} in attempt {attempt}: {values}"
    if m.against_checkpoint is not None:
        where = (f"rank {m.rank} began step {m.step} in attempt {attempt} from another state than checkpoint step "
                 f"{m.against_checkpoint} saved")
    parts = [p for p in DIGEST_PARTS if f"digest_{p}" in m.differ]
    if parts:
        return f"{where}: {PART_CAUSES[parts[0]]} (digest_{parts[0]} differs" + (
            f"; so does {', '.join('digest_' + p for p in parts[1:])})" if parts[1:] else ")")
    first = mine[0]
    if first is m:
        return (f"{where}: the first re-done step's {metric} is computed before any update, so the state the restart "
                "began from differs — the weights, or the batch it was fed (data position, RNG)")
    return (f"{where}: the first re-done step ({first.step}) reproduced, so the weights and its batch were right; "
            f"what the steps after the first update depend on was not restored: {AFTER_THE_FIRST_STEP}")


def _state_metric_of(run: RunReports) -> str:
    """The state metric the run's reports carry (auto: the one found), else the setting."""
    used = next((r.data.state_metric for r in run.rows if r.data.state_metric), None)
    setting = run.started.state_metric if run.started else None
    return used or ("state metric (auto)" if setting == "auto" else setting) or "state"

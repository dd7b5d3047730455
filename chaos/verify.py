"""Verdicts: checked claims about a timeline, each carrying its evidence.

Knows nothing about transports or clusters: everything it judges is in the timeline
(recorder, fault and node events) plus the expectations the suite states.

Statuses: ``pass``; ``fail``; ``unverifiable`` (the evidence to decide is missing, e.g.
no step metric — never guessed, and by default it fails the test); ``expected`` (an
expected failure was correctly seen, e.g. an exhausted retry budget in a
budget-exhaustion suite); ``n/a`` (the claim does not arise in this run, e.g. no step
was re-done so there is no state to compare — said so, never counted as a pass).
Failure messages start with the diagnosis phrase, which the report's categories match on.

A driver may hold several Train runs (``fit()`` twice); every rule is applied per run.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

from chaos.attribution import CAPACITY_ERRORS, Attribution, attribute, faulted_run_decisions
from chaos.errors import VerificationError
from chaos.faults.catalog import KINDS, limit_name
from chaos.timeline import Event, Timeline, faulted_runs, latest_run, recovery_metrics, runs, steps_of
from chaos.train.recording import AUTO_STEP_METRICS as AUTO_STEP_NAMES

# A re-done step's state value (e.g. loss) must match the earlier attempt's this closely.
STATE_RTOL = 1e-4
STATE_ATOL = 1e-6

# Every diagnosis a verdict that does not pass can carry, by verdict: the one list
# docs/testing.md's coverage map answers for (tests/unit/test_coverage_map.py checks that
# each has its row, and that every diagnosis written in chaos/ is here).
DIAGNOSES: tuple[str, ...] = (
    # resumed-from-latest (after a restart, or after a resubmission)
    "restarted from scratch", "resumed from an older checkpoint", "resumed past the checkpoint",
    "resumed at an unexpected step", "ranks disagree", "unverifiable: no step metric",
    "unverifiable: step metric goes back", "unverifiable: no step after the restart",
    "unverifiable: resumed at the checkpoint's own step",
    "unverifiable: no checkpoint reported", "unverifiable: no step at the checkpoint",
    "unverifiable: no reporting stride", "unverifiable: events unread", "unverifiable: events lost",
    # state-restored, final-state ("state differs": a warning — not declared deterministic)
    "state not restored", "state differs", "final state differs", "unverifiable: run did not finish", "unverifiable: no state metric",
    "unverifiable: no baseline",
    # state-trajectory (besides state not restored / state differs / no baseline / no state metric)
    "unverifiable: baseline not reproduced", "unverifiable: no step to compare",
    # within-budget
    "retry budget exhausted", "charged to the wrong budget class", "unexpected number of charged failures",
    "budget not exhausted", "unrelated failure", "unverifiable: no failure-policy record",
    "unverifiable: no failure evidence",
    # recovery-time
    "recovery too slow", "inconclusive",
    # preemption-window
    "no just-in-time checkpoint", "checkpoint inside the preemption window", "unverifiable: no checkpoint cadence",
    "unverifiable: no persist record",
    # node-agent, node-recovered (an xid fault's automatic node recovery chain)
    "node agent never acted", "node agent too slow", "node not recovered", "node recovery too slow",
    "unverifiable: no node agent evidence", "charge not among the measured outcomes",
    "unverifiable: no measured outcomes",
    # run-finished
    "run failed", "run did not finish", "run did not fail cleanly", "unverifiable: no job status",
    # progress (chaos.progress, chaos.experiment), healed
    "training stalled", "did not resume", "crash loop", "run ended before the fault", "driver did not exit",
    "cleanup failed",
    # head loss (chaos.faults.head): <outcome> is the one seen (head.OUTCOMES); "cluster lost"
    # is the expected verdict's, cut from the head-loss diagnosis at run time
    "head loss: <outcome>", "head loss: no reboot", "unverifiable: no outcome", "cluster lost",
    "unexpected worker node fate",
)


@dataclasses.dataclass
class Verdict:
    name: str
    status: str  # pass | fail | unverifiable | expected | n/a | warning (shown, never fails)
    message: str
    diagnosis: str | None = None
    evidence: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    def fails(self, unverifiable: str = "fail") -> bool:
        """Whether this verdict fails the test (``unverifiable`` is ``fail`` or ``warn``)."""
        return self.status == "fail" or (self.status == "unverifiable" and unverifiable == "fail")

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
    # A preempted run must (True) or must not (False) commit a checkpoint between the notice
    # and the node's end; None: the preemption verdict only reports what happened.
    checkpoint_in_window: bool | None = None
    # The fault-free run's final state to compare with (final-state verdict; chaos.baseline
    # makes it); None: the suite did not ask for the check.
    final_state: "Baseline | None" = None
    # The fault-free run to follow step by step (state-trajectory verdict; chaos.baseline makes
    # it); None: the suite did not ask (chaos.expect(baseline=True), --chaos-baseline).
    trajectory: "Baseline | None" = None
    # The workload declares that the same state at the same step gives the same metrics: a
    # state value that does not reproduce then fails; without it, it is a warning (a data
    # order or RNG the script does not restore can explain it).
    deterministic: bool = False
    # How closely a numeric state value must reproduce (--chaos-state-rtol): every state verdict.
    state_rtol: float = STATE_RTOL
    # A fault whose charge is the platform's (``xid``: Ray sees a rank's CUDA error and then the
    # node's recovery, in a timing-dependent order): the per-class charges measured for it; the
    # one seen must be among them.  None: any charge within the limits.
    charge_outcomes: list[dict[str, int]] | None = None
    # What a head fault should do to the run (chaos.faults.head.OUTCOMES); None: what the pinned
    # Ray was measured to do (HEAD_OUTCOME_BY_GCS_FT).
    head_outcome: str | None = None


# -- resumed-from-latest -------------------------------------------------------------
@dataclasses.dataclass
class _RankJudgement:
    rank: int
    got: Any
    status: str  # pass | fail | unverifiable
    diagnosis: str | None = None
    expected: Any = None
    checkpoint_step: Any = None
    rule: str = ""
    why: str = ""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class _RunReports:
    """One run's reports, with the per-rank views the resume rule needs."""

    def __init__(self, events: list[Event], deterministic: bool = True, baseline: "Baseline | None" = None):
        self.deterministic = deterministic
        # The fault-free run's state value per (rank, step), where the suite made one: what a
        # trained step must reproduce when no earlier attempt reported it.
        started = next((e for e in events if e.kind == "controller_started"), None)
        metric = started.data.get("state_metric") if started else None
        self.baseline_values = {(rank, _step_key(step)): state[metric]
                                for rank, rows in (baseline.trajectory if baseline else {}).items()
                                for step, state in rows if metric and isinstance(state.get(metric), (int, float))}
        self.reports = [e for e in events if e.kind == "report"]
        self.persisted = [e for e in events if e.kind == "checkpoint_persisted"]
        # an attempt whose start event was lost (events_lost) still shows in its reports
        self.attempts = sorted({e.attempt for e in events if e.kind == "attempt_started"}
                               | {r.attempt for r in self.reports if r.attempt is not None})
        self.stepped = [r for r in self.reports if steps_of(r)]

    def strides_before(self, attempt: int) -> dict[int, Any]:
        """Per rank: the most common positive step difference between consecutive reports
        of one attempt, from the attempts before ``attempt`` only — the attempt being judged
        does not vote for the stride it is judged by."""
        diffs: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
        last: dict[tuple[int, int], Any] = {}
        for r in self.stepped:
            if r.attempt >= attempt:
                continue
            for rank, step in steps_of(r).items():
                prev = last.get((r.attempt, rank))
                if prev is not None and step > prev:
                    diffs[rank][step - prev] += 1
                last[(r.attempt, rank)] = step
        return {rank: c.most_common(1)[0][0] for rank, c in diffs.items() if c}

    def first_of(self, attempt: int) -> Event | None:
        return next((r for r in self.stepped if r.attempt == attempt), None)

    def ranks_in(self, attempt: int) -> set[int]:
        """Every rank a report of ``attempt`` names, with a step or without one."""
        return {int(rank) for r in self.of_attempt(attempt) for rank in (r.data.get("steps") or {})} \
            | {rank for r in self.of_attempt(attempt) for rank in steps_of(r)}

    def first_step_of(self, attempt: int, rank: int) -> tuple[Event, Any] | None:
        """``rank``'s first report in ``attempt`` that carries its step, and that step."""
        return next(((r, steps_of(r)[rank]) for r in self.stepped if r.attempt == attempt and rank in steps_of(r)),
                    None)

    def of_attempt(self, attempt: int) -> list[Event]:
        return [r for r in self.reports if r.attempt == attempt]

    def next_after(self, commit: Event, rank: int):
        """The step ``rank`` reported right after ``commit``, in the attempt that committed it
        (a report at the checkpoint's own step right after it — an evaluation — is skipped)."""
        after = False
        ck = steps_of(commit).get(rank)
        for r in self.stepped:
            if r is commit:
                after = True
                continue
            if after and r.attempt == commit.attempt and rank in steps_of(r) \
                    and not _same_step(steps_of(r)[rank], ck):
                return steps_of(r)[rank]
        return None

    def resume_points(self, commit: Event, rank: int, attempt: int) -> tuple[Any, Any, str] | None:
        """(checkpoint step, expected next step, rule) for ``rank`` resuming from ``commit``
        in ``attempt``."""
        ck, whose = steps_of(commit).get(rank), ""
        if ck is None and rank in (commit.data.get("without_ranks") or ()):
            # Committed without this rank (preempted, under relax_collectives_on_preemption): the
            # checkpoint is the whole run's, at the step the ranks that committed it agree on.
            held = {s for s in steps_of(commit).values()}
            if len(held) == 1:
                ck = held.pop()
                whose = (f" (committed by rank {', '.join(map(str, sorted(steps_of(commit))))} without rank {rank}, "
                         "which was being preempted)")
        if ck is None:
            return None
        nxt = self.next_after(commit, rank)
        if nxt is not None:
            return ck, nxt, f"the step that followed checkpoint step {ck}{whose} in attempt {commit.attempt}'s reports"
        stride = self.strides_before(attempt).get(rank)
        if stride is not None:
            return ck, ck + stride, (f"checkpoint step {ck}{whose} + the run's reporting stride {stride} before the "
                                     "fault")
        return ck, None, (f"no report followed checkpoint step {ck}{whose} and the reports before the fault showed "
                          "no stride")

    def recommitted(self, attempt: int, rank: int, commits: list[Event]) -> Any:
        """The first step at which ``attempt`` committed a checkpoint ``rank`` had already
        committed before it (work done twice), or None."""
        done = {steps_of(c).get(rank) for c in commits} - {None}
        for r in self.of_attempt(attempt):
            step = steps_of(r).get(rank)
            if r.data.get("checkpoint") and step is not None and _in(step, done):
                return step
        return None

    def uncommitted_before(self, attempt: int) -> list[Event]:
        """Checkpoints a rank persisted to storage in an attempt before ``attempt`` that Ray never
        committed (a fault came before every rank had reported them): Train V2 writes each
        rank's checkpoint folder first, so a script that scans storage can load one."""
        committed = {r.data.get("checkpoint") for r in self.reports if r.data.get("checkpoint")}
        return [p for p in self.persisted if p.attempt < attempt and p.data.get("checkpoint") not in committed
                and p.data.get("step") is not None]

    def value_at(self, rank: int, step: Any, attempts: Callable[[int], bool]) -> tuple[int, float] | None:
        """(attempt, state value) of the first report of ``rank`` at ``step`` in an attempt
        ``attempts`` accepts."""
        for r in self.stepped:
            if attempts(r.attempt) and _same_step(steps_of(r).get(rank), step):
                value = (r.data.get("states") or {}).get(str(rank))
                if value is not None:
                    return r.attempt, value
        return None

    def trained_after(self, attempt: int, rank: int, step: Any) -> Any:
        """The first step ``rank`` reported in ``attempt`` beyond ``step``."""
        return next((steps_of(r)[rank] for r in self.stepped if r.attempt == attempt
                     and rank in steps_of(r) and steps_of(r)[rank] > step), None)

    def going_back(self) -> tuple[int, int, Any, Any] | None:
        """(attempt, rank, step, the smaller step after it): the first place where a rank's
        step metric went back within one attempt — a counter that resets (an epoch-local
        step) cannot tell a resume from a fresh start."""
        last: dict[tuple[int, int], Any] = {}
        for r in self.stepped:
            for rank, step in steps_of(r).items():
                prev = last.get((r.attempt, rank))
                if prev is not None and step < prev and not _same_step(step, prev):
                    return r.attempt, rank, prev, step
                last[(r.attempt, rank)] = step
        return None

    def ranks_agreed_before(self, attempt: int) -> bool:
        return all(len(set(steps_of(r).values())) <= 1 for r in self.stepped if r.attempt < attempt)


STEP_TOL = 1e-9  # fractional (float) steps compare equal within this


def _same_step(a: Any, b: Any) -> bool:
    return a is not None and b is not None and abs(a - b) <= STEP_TOL * max(1.0, abs(a), abs(b))


def _in(step: Any, steps: set) -> bool:
    return any(_same_step(step, s) for s in steps)


def _reproduces(value: float, earlier: float) -> bool:
    return abs(value - earlier) <= STATE_ATOL + STATE_RTOL * abs(earlier)


_SEVERITY = ["restarted from scratch", "resumed from an older checkpoint", "resumed past the checkpoint",
             "resumed at an unexpected step"]


def _judge_rank(run: _RunReports, rank: int, got, commits: list[Event], first_step, attempt: int) -> _RankJudgement:
    if not commits:
        rule = "no checkpoint existed yet, so a fresh start at the run's first step"
        if _same_step(got, first_step):
            return _RankJudgement(rank, got, "pass", "no checkpoint existed yet", first_step, None, rule)
        return _RankJudgement(rank, got, "fail", "resumed at an unexpected step", first_step, None, rule,
                              f"no checkpoint existed yet, so step {first_step} was expected")
    points = run.resume_points(commits[-1], rank, attempt)
    if points is None:
        return _RankJudgement(rank, got, "unverifiable", "unverifiable: no step at the checkpoint",
                              why=f"the latest checkpoint's report carried no step for rank {rank}")
    ck, nxt, rule = points
    if _same_step(got, nxt):
        return _RankJudgement(rank, got, "pass", None, nxt, ck, rule)
    if _same_step(got, ck):
        return _judge_at_checkpoint_step(run, rank, got, ck, nxt, attempt, commits)
    if nxt is None:
        return _RankJudgement(rank, got, "unverifiable", "unverifiable: no reporting stride", None, ck, rule, rule)
    older = []
    for c in commits[:-1]:
        p = run.resume_points(c, rank, attempt)
        if p is not None and _in(got, {p[0], p[1]}):
            older.append(p[0])
    if first_step is not None and got <= first_step:
        diagnosis = "restarted from scratch"
    elif older:
        diagnosis = "resumed from an older checkpoint"
    elif got > nxt:
        diagnosis = "resumed past the checkpoint"
    else:
        diagnosis = "resumed at an unexpected step"
    why = {"restarted from scratch": f"the run's first step was {first_step}",
           "resumed from an older checkpoint": f"that follows checkpoint step {older[-1] if older else '?'}",
           "resumed past the checkpoint": f"steps {nxt}..{got} were skipped",
           "resumed at an unexpected step": f"expected {nxt}"}[diagnosis]
    if diagnosis == "resumed past the checkpoint":
        stride = nxt - ck
        loaded = [p for p in run.uncommitted_before(attempt)
                  if ck < p.data["step"] < got and got - p.data["step"] <= stride + STEP_TOL]
        if loaded:
            p = loaded[-1]
            why += (f": it follows step {p.data['step']}, whose checkpoint rank {p.data['rank']} had written to "
                    f"storage in attempt {p.attempt} ({p.data['checkpoint']}) but Ray never committed (the fault came "
                    f"before every rank reported it; the latest committed checkpoint is step {ck}) — the script "
                    "loaded a checkpoint from storage instead of ray.train.get_checkpoint()")
    return _RankJudgement(rank, got, "fail", diagnosis, nxt, ck, rule, why)


def _judge_at_checkpoint_step(run: _RunReports, rank: int, got, ck, nxt, attempt: int,
                              commits: list[Event]) -> _RankJudgement:
    """A first report at the checkpoint's own step is an evaluation after loading it, or step
    ``ck`` trained again.  A checkpoint committed again at a step committed before is work
    done twice; otherwise neither case reproduces step ``ck``'s earlier (pre-update) value,
    so the first *trained* step after it decides — it must reproduce what an earlier
    attempt reported for that step."""
    again = run.recommitted(attempt, rank, commits)
    if again is not None:
        rule = f"attempt {attempt} committed checkpoint step {again} again"
        if len({steps_of(c).get(rank) for c in commits} - {None}) == 1:  # no older checkpoint to come from
            return _RankJudgement(rank, got, "fail", "restarted from scratch", nxt, ck, rule,
                                  f"step {again}, the run's first checkpoint, was trained and committed again")
        return _RankJudgement(rank, got, "fail", "resumed from an older checkpoint", nxt, ck, rule,
                              f"steps {got}..{again} were trained again: step {again} had been committed before")
    again_from_older = _trained_again_from_older(run, rank, ck, attempt, commits)
    if again_from_older is not None:
        diagnosis, rule, why = again_from_older
        return _RankJudgement(rank, got, "fail", diagnosis, nxt, ck, rule, why)
    trained = run.trained_after(attempt, rank, ck)
    if trained is not None and nxt is not None and trained > nxt and not _same_step(trained, nxt):
        return _RankJudgement(rank, got, "fail", "resumed past the checkpoint", nxt, ck,
                              f"after a first report at checkpoint step {ck}, the next step reported is the one that "
                              f"followed the checkpoint before the fault ({nxt})",
                              f"attempt {attempt} reported step {ck}, then step {trained}: steps {nxt}..{trained} "
                              "were skipped")
    earlier = run.value_at(rank, trained, lambda a: a < attempt) if trained is not None else None
    if earlier is None and (rank, _step_key(trained)) in run.baseline_values:
        earlier = ("the fault-free baseline", run.baseline_values[(rank, _step_key(trained))])
    now = run.value_at(rank, trained, lambda a: a == attempt) if trained is not None else None
    rule = (f"a first report at checkpoint step {ck} is judged by the first trained step after it "
            f"({trained if trained is not None else 'none reported'}) against an earlier attempt's value, or "
            "the fault-free baseline's")
    if earlier is None or now is None:
        missing = ("the attempt reported no step after it" if trained is None else
                   f"no state value at step {trained} in attempt {attempt}" if now is None else
                   f"no earlier attempt (nor a fault-free baseline) reported step {trained} with a state value")
        return _RankJudgement(rank, got, "unverifiable", "unverifiable: resumed at the checkpoint's own step", nxt,
                              ck, rule, f"attempt {attempt} first reported step {ck}, the checkpoint's own step: an "
                              f"evaluation after loading it, or step {ck} trained again — {missing} to tell which "
                              "(report the training loss, or --chaos-state-metric NAME, and let the fault land "
                              "after the step that follows a checkpoint is reported, or compare with a fault-free "
                              "run: --chaos-baseline)")
    (was_attempt, was), (_, value) = earlier, now
    where = f"attempt {was_attempt}" if isinstance(was_attempt, int) else was_attempt
    if not _reproduces(value, was):
        why = (f"step {trained} gave {value:.6g} in attempt {attempt} but {was:.6g} in {where}: "
               f"step {ck} was trained again, or the state was not restored")
        if run.deterministic:
            return _RankJudgement(rank, got, "fail", "state not restored", nxt, ck, rule, why)
        return _RankJudgement(rank, got, "warning", "state differs", nxt, ck, rule,
                              why + f" (a warning: the workload is not declared deterministic, {DETERMINISM_HINT})")
    return _RankJudgement(rank, got, "pass", None, nxt, ck, rule + f": step {trained} reproduced {was:.6g} of {where}")


def _trained_again_from_older(run: _RunReports, rank: int, ck, attempt: int,
                              commits: list[Event]) -> tuple[str, str, str] | None:
    """(diagnosis, rule, why) when the first report at checkpoint step ``ck`` reproduces the
    value step ``ck`` had *before* it was trained: only the state before that checkpoint
    gives it (an evaluation after loading checkpoint ``ck``, or step ``ck`` trained again
    from it, start from the state after it).  Not applied where the earlier attempt's value
    at ``ck`` equals its value at the next step it reported: a metric that does not move with
    training cannot tell the two states apart."""
    now = run.value_at(rank, ck, lambda a: a == attempt)
    before = run.value_at(rank, ck, lambda a: a < attempt)
    if now is None or before is None or not _reproduces(now[1], before[1]):
        return None
    following = next((steps_of(r)[rank] for r in run.stepped if r.attempt == before[0] and rank in steps_of(r)
                      and steps_of(r)[rank] > ck), None)
    moved = run.value_at(rank, following, lambda a: a == before[0]) if following is not None else None
    if moved is None or _reproduces(moved[1], before[1]):
        return None
    older = sorted({steps_of(c)[rank] for c in commits if rank in steps_of(c) and steps_of(c)[rank] < ck})
    rule = (f"a first report at checkpoint step {ck} that gives step {ck}'s value from before it was trained "
            f"(attempt {before[0]}) comes from the state before checkpoint {ck}")
    how = f"step {ck} gave {now[1]:.6g} in attempt {attempt}, as it did in attempt {before[0]} before it was trained"
    if older:
        return ("resumed from an older checkpoint", rule,
                f"{how}: it was trained again from an older state (checkpoint step {older[-1]}), not "
                f"evaluated after loading checkpoint {ck}")
    return "restarted from scratch", rule, f"{how}: it was trained again without the checkpoint's state"


def resumed_from_latest(timeline: Timeline, deterministic: bool = True,
                        baseline: "Baseline | None" = None) -> list[Verdict]:
    """One verdict per restart per run: did every rank resume right after the latest checkpoint?
    ``baseline``: a fault-free run of the run the faults hit, whose values decide a resume at a
    checkpoint's own step when no earlier attempt reported the step after it."""
    all_runs = runs(timeline)
    hit = faulted_runs(timeline)
    verdicts = []
    for i, (run_id, events) in enumerate(all_runs, 1):
        label = f"run {i}, " if len(all_runs) > 1 else ""
        verdicts.extend(_resumes_of_run(timeline, run_id, events, label, deterministic,
                                        baseline if hit and run_id == hit[-1] else None))
    return verdicts


def _resumes_of_run(timeline: Timeline, run_id: str, events: list[Event], label: str,
                    deterministic: bool = True, baseline: "Baseline | None" = None) -> list[Verdict]:
    run = _RunReports(events, deterministic, baseline)
    if len(run.attempts) < 2:
        return []
    started = next((e for e in events if e.kind == "controller_started"), None)
    if not run.stepped:
        data = started.data if started else {}
        names = data.get("step_metric_names") or [data.get("step_metric", "step")]
        metric = ", ".join(repr(n) for n in names)
        return [Verdict(f"resumed-from-latest ({label}run)", "unverifiable",
                        f"unverifiable: no step metric {metric} in the run's reports; pass --chaos-step-metric "
                        "with the metric your script reports", "unverifiable: no step metric",
                        {"reports": len(run.reports), "step_metric": metric, "run_id": run_id})]
    if not any(r.data.get("checkpoint") for r in run.reports):
        return [Verdict(f"resumed-from-latest ({label}run)", "unverifiable",
                        "unverifiable: the run reported no checkpoint to Ray Train, so no restart can be judged "
                        "(a script that saves checkpoints itself must also pass them to ray.train.report)",
                        "unverifiable: no checkpoint reported", {"reports": len(run.reports), "run_id": run_id})]
    back = run.going_back()
    if back is not None:
        attempt, rank, prev, step = back
        metric = _step_metric_of(started, run)
        return [Verdict(f"resumed-from-latest ({label}run)", "unverifiable",
                        f"unverifiable: step metric {metric!r} goes back: rank {rank} reported step {prev}, then "
                        f"{step} in attempt {attempt}; a counter that resets (an epoch-local step) cannot tell a "
                        "resume from a fresh start: report a step that only grows (e.g. global_step) and name it "
                        "with --chaos-step-metric", "unverifiable: step metric goes back",
                        {"run_id": run_id, "attempt": attempt, "rank": rank, "step_metric": metric,
                         "steps": [prev, step]})]
    first_attempt = run.first_of(run.attempts[0])
    first_steps = steps_of(first_attempt) if first_attempt else {}
    starts = {e.attempt: e for e in events if e.kind == "attempt_started"}
    verdicts, silent = [], []
    for attempt in run.attempts[1:]:
        first = run.first_of(attempt)
        name = f"resumed-from-latest ({label}attempt {attempt})"
        if first is None:
            reported = run.of_attempt(attempt)
            if reported:  # it trained and reported, but nothing says where it began
                verdicts.append(_stepless(name, run_id, attempt, reported, _step_metric_of(started, run)))
                silent = []
                continue
            silent.append(attempt)  # never reported (failed while starting, or the run ended): judged by others
            continue
        commits = [r for r in run.reports if r.attempt < attempt and r.data.get("checkpoint")]
        judged = [_judge_rank(run, rank, got, commits, first_steps.get(rank), attempt)
                  for rank, got in sorted(steps_of(first).items())]
        judged += [_judge_late_step(run, rank, commits, first_steps.get(rank), attempt)
                   for rank in sorted(run.ranks_in(attempt) - set(steps_of(first)))]
        latest = commits[-1] if commits else None
        evidence = {
            "run_id": run_id, "attempt": attempt, "attempts_that_never_reported": list(silent),
            "latest_checkpoint": latest.data["checkpoint"] if latest else None,
            "latest_checkpoint_step": steps_of(latest).get(0, latest.data.get("step")) if latest else None,
            "committed_steps": [c.data.get("step") for c in commits],
            "first_step_of_attempt": first.data.get("step"),
            "first_steps_of_run": first_steps,
            "reporting_stride": run.strides_before(attempt),
            "step_sources": first.data.get("step_sources"),
            "ranks": {j.rank: j.to_json() for j in judged},
        }
        verdict = _combine(name, attempt, judged, latest, run.ranks_agreed_before(attempt), evidence)
        gap = _gap_before(timeline, run_id, attempt, first, commits, starts)
        verdicts.append(verdict if gap is None else _against_missing_events(verdict, *gap, attempt))
        silent = []
    return verdicts


def _judge_late_step(run: _RunReports, rank: int, commits: list[Event], first_step, attempt: int) -> _RankJudgement:
    """A rank whose first report(s) in ``attempt`` carried no step: its first step shows where
    it began only when that step is already before the checkpoint (work done again whatever
    came first); any other first step is unverifiable, never a pass."""
    own = run.first_step_of(attempt, rank)
    unknown = f"rank {rank}'s first report(s) in attempt {attempt} carried no step"
    if own is None:
        return _RankJudgement(rank, None, "unverifiable", "unverifiable: no step after the restart",
                              why=f"{unknown}, nor did any later one")
    got = own[1]
    judged = _judge_rank(run, rank, got, commits, first_step, attempt)
    ck = judged.checkpoint_step
    if judged.status == "fail" and ck is not None and got < ck and not _same_step(got, ck):
        return dataclasses.replace(judged, why=f"{judged.why}; {unknown}, and its first step, {got}, is before "
                                               f"checkpoint step {ck}")
    return _RankJudgement(rank, got, "unverifiable", "unverifiable: no step after the restart", judged.expected, ck,
                          judged.rule, f"{unknown}: its first step, {got}, cannot show where it began")


#: what events the harness did not see cannot turn into a right resume: a later checkpoint than
#: the latest one seen, or an earlier first report of the attempt, only make these worse (and
#: ranks that disagree did so within one report round)
WRONG_WHATEVER_WAS_UNREAD = ("restarted from scratch", "resumed from an older checkpoint", "ranks disagree")


def _gap_before(timeline: Timeline, run_id: str, attempt: int, first: Event, commits: list[Event],
                starts: dict[int, Event]) -> tuple[Event, bool] | None:
    """A gap in the run's events that leaves unknown where ``attempt`` began or the latest
    checkpoint before it, and whether its beginning may be in it: the unread end of a lost
    job's events log (``events_unread``: one before the attempt, with no checkpoint committed
    since), or events the recorder could not write (``events_lost``: the attempt's first report
    read after them, its start not read after them or no checkpoint read since)."""
    for gap in reversed(timeline.of("events_unread", source="harness")):
        since = gap.data.get("next_attempt")
        if gap.data.get("run_id") == run_id and since is not None and since <= attempt:
            if not any(c.attempt is not None and c.attempt >= since for c in commits):
                return gap, False
            break
    for gap in timeline.of("events_lost", source="harness"):
        after = gap.data.get("before_t")  # the first event read after the lost ones
        if gap.data.get("run_id") != run_id or after is None or first.t < after:
            continue
        start = starts.get(attempt)
        if start is None or start.t < after:
            return gap, True
        if not any(c.t >= after for c in commits):
            return gap, False
    return None


def _missing(gap: Event) -> str:
    if gap.kind == "events_lost":
        first, last = gap.data.get("seqs") or ("?", "?")
        return (f"the recorder could not write events {first}..{last} of job {gap.data.get('job_id')}'s events log "
                "(the Train controller's log says why)")
    return (f"the events log of job {gap.data.get('job_id')}, whose driver was lost, could not be read to its end "
            f"({gap.data.get('why')})")


def _against_missing_events(verdict: Verdict, gap: Event, start_unseen: bool, attempt: int) -> Verdict:
    """A resume judged on the events read, where a gap may hold a later checkpoint (or the
    attempt's real first report): a pass (or a resume past the seen checkpoint) proves nothing.
    The judgement on what was read stays in the evidence only: its diagnosis phrase in the
    message would file the test under that diagnosis in the report."""
    if verdict.status == "fail" and verdict.diagnosis in WRONG_WHATEVER_WAS_UNREAD:
        return verdict
    seen, got = verdict.evidence.get("latest_checkpoint_step"), verdict.evidence.get("first_step_of_attempt")
    lost = gap.kind == "events_lost"
    diagnosis = "unverifiable: events lost" if lost else "unverifiable: events unread"
    evidence = {**verdict.evidence, gap.kind: gap.data,
                "judged_on_what_was_read": {"status": verdict.status, "message": verdict.message}}
    missing = (f"attempt {attempt}'s first report" if start_unseen
               else f"a checkpoint {'' if lost else 'it '}committed" + (f" after step {seen}" if seen is not None else ""))
    hint = ("give the Ray logs directory of the controller's node room (a full disk there loses events)" if lost
            else "keep the head's Ray logs directory across its restarts, e.g. a volume at /tmp/ray, so the "
                 "harness can read it")
    return Verdict(verdict.name, "unverifiable",
                   f"{diagnosis}: {_missing(gap)}, so {missing} would be missing and attempt {attempt}'s "
                   f"start at step {got} cannot be judged (the evidence holds the judgement on what was read alone; "
                   f"{hint})", diagnosis, evidence)


def _step_metric_of(started: Event | None, run: _RunReports) -> str:
    """The step metric the run's reports were read with (the name found, else the names tried)."""
    used = next((r.data.get("step_metric") for r in run.stepped if r.data.get("step_metric")), None)
    if used:
        return used
    data = started.data if started else {}
    return ", ".join(data.get("step_metric_names") or [data.get("step_metric", "step")])


def _stepless(name: str, run_id: str, attempt: int, reported: list[Event], metric: str) -> Verdict:
    """A resumed attempt that reported without a step: never a pass, and never skipped."""
    keys = sorted({k for r in reported for k in (r.data.get("metrics") or {})})
    renamed = [k for k in keys if k in AUTO_STEP_NAMES and k != metric]
    msg = (f"unverifiable: attempt {attempt} reported {len(reported)} time(s) without the step metric {metric!r} "
           f"(it reported {', '.join(repr(k) for k in keys) or 'no metrics'})")
    if renamed:
        msg += f"; the step metric changed name between attempts: {metric!r} before, {renamed[0]!r} now"
    return Verdict(name, "unverifiable", msg, "unverifiable: no step after the restart",
                   {"run_id": run_id, "attempt": attempt, "reports": len(reported), "metrics": keys,
                    "step_metric": metric})


#: what a head fault does to the run, by whether the GCS is fault tolerant (Ray 2.60, measured:
#: README): the driver runs on the head and dies with it; without an external Redis the
#: restarted head has an empty GCS
HEAD_OUTCOME_BY_GCS_FT = {True: "driver-lost", False: "cluster-lost"}


def head_loss_outcome(loss: dict, expected: str | None = None) -> Verdict:
    """The run's fate after a head fault (a ``head_loss`` event's data, chaos.faults.head)
    against ``expected`` (default: what the pinned Ray was measured to do)."""
    expected = expected or HEAD_OUTCOME_BY_GCS_FT[bool(loss.get("gcs_ft"))]
    name = f"head-loss ({loss.get('fault')}, GCS fault tolerance {'on' if loss.get('gcs_ft') else 'off'})"
    outcome, diagnosis, boots = loss.get("outcome"), loss.get("diagnosis", ""), loss.get("head_boot_ids") or []
    if outcome is None:
        return Verdict(name, "unverifiable", f"unverifiable: {diagnosis}", "unverifiable: no outcome", loss)
    up = loss.get("head_up_s")
    times = (f"head unreachable {_s(loss.get('head_unreachable_s'))} and back {_s(up)} after the fault"
             if up is not None else "head did not come back")
    if len(boots) == 2:
        times += (f", its host rebooted (boot id {boots[0][:8]} → {boots[1][:8]})" if boots[0] != boots[1]
                  else ", its host kept its boot id")
    if outcome != expected:
        return Verdict(name, "fail", f"head loss: expected {expected}, got {outcome}: {diagnosis} ({times})",
                       f"head loss: {outcome}", loss)
    if loss.get("fault") == "head-reboot" and len(boots) == 2 and boots[0] == boots[1]:
        return Verdict(name, "fail", f"head loss: expected the head's host to reboot, but it kept boot id "
                       f"{boots[0]} ({times})", "head loss: no reboot", loss)
    status = "expected" if outcome == "cluster-lost" else "pass"
    return Verdict(name, status, f"{diagnosis} ({times})", diagnosis.split(":")[0], loss)


def workers_after_head_loss(loss: dict) -> Verdict:
    """Every worker node outlived the head fault under its Ray node id (GCS fault tolerance),
    or none did (a new GCS: they came back as new nodes)."""
    kept = bool(loss.get("gcs_ft"))
    before, after = loss.get("workers_before") or {}, loss.get("workers_after") or {}
    survived = set(before) & set(after)
    evidence = {"fault": loss.get("fault"), "before": before, "after": after,
                "expected": "kept" if kept else "new ids"}
    if kept:
        ok = bool(survived) and survived == set(before)
        msg = (f"all {len(survived)} worker nodes kept their Ray node ids through the head's restart" if ok else
               "worker nodes after head loss: lost "
               f"{sorted(n[:8] for n in set(before) - survived) or 'every node'}, expected all kept")
    else:
        ok = not survived and len(after) >= len(before)
        msg = ("no worker node kept its Ray node id: the new GCS did not know them; all came back as new nodes"
               if ok else f"worker nodes after head loss: {sorted(n[:8] for n in survived)} kept their ids, "
                          f"{len(after)} of {len(before)} alive, expected all under new ids")
    return Verdict(f"worker nodes after head loss ({loss.get('fault')})", "pass" if ok else "fail", msg,
                   None if ok else "unexpected worker node fate", evidence)


def head_losses(timeline: Timeline, expect: "Expectation") -> list[Verdict]:
    """For every head fault: what became of the run, and of the worker nodes."""
    out = []
    for e in timeline.of("head_loss"):
        out += [head_loss_outcome(e.data, expect.head_outcome), workers_after_head_loss(e.data)]
    return out


def _combine(name: str, attempt: int, judged: list[_RankJudgement], latest: Event | None, agreed: bool,
             evidence: dict) -> Verdict:
    failed = sorted((j for j in judged if j.status == "fail"), key=lambda j: (_SEVERITY.index(j.diagnosis)
                                                                               if j.diagnosis in _SEVERITY else 9))
    ok = [j for j in judged if j.status == "pass"]
    ck_desc = (f"checkpoint step {judged[0].checkpoint_step} was committed ({latest.data['checkpoint']})"
               if latest is not None else "no checkpoint existed")
    if failed:
        lead = failed[0]
        evidence["rule"] = lead.rule
        every = " on every rank" if len(judged) > 1 else ""
        if len(failed) == len(judged) and len({j.got for j in judged}) == 1:
            head = f"{lead.diagnosis}: attempt {attempt} began at step {lead.got}{every}"
            head += f" although {ck_desc} ({lead.why})" if latest is not None else f" ({lead.why})"
        else:
            bad = ", ".join(f"rank {j.rank} began attempt {attempt} at step {j.got} ("
                            + (f"{j.diagnosis}: " if j.diagnosis != lead.diagnosis else "") + f"{j.why})"
                            for j in failed)
            head = f"{lead.diagnosis}: {bad}"
            if ok:
                head += " while " + ", ".join(f"rank {j.rank} resumed at {j.got}" for j in ok)
            if latest is not None:
                head += f"; {ck_desc}"
        return Verdict(name, "fail", f"{head} (rule: {lead.rule})", lead.diagnosis, evidence)
    # a rank whose first report had no step (_judge_late_step) began at a step nobody saw
    starts = {j.rank: j.got for j in judged if j.diagnosis != "unverifiable: no step after the restart"}
    if len(set(starts.values())) > 1 and agreed:
        evidence["rule"] = "ranks reported the same step before the restart"
        parts = ", ".join(f"rank {r} at step {s}" for r, s in starts.items())
        return Verdict(name, "fail", f"ranks disagree: after the restart attempt {attempt} began with {parts}, "
                       "although the ranks reported the same steps before it", "ranks disagree", evidence)
    unsure = [j for j in judged if j.status == "unverifiable"]
    if unsure:
        evidence["rule"] = unsure[0].rule
        return Verdict(name, "unverifiable", f"unverifiable: attempt {attempt}, rank {unsure[0].rank}: {unsure[0].why}",
                       unsure[0].diagnosis, evidence)
    warned = [j for j in judged if j.status == "warning"]
    if warned:
        evidence["rule"] = warned[0].rule
        return Verdict(name, "warning", f"state differs: attempt {attempt}, rank {warned[0].rank} began at the "
                       f"checkpoint's own step {warned[0].got}, and {warned[0].why}", "state differs", evidence)
    j = judged[0]
    evidence["rule"] = j.rule
    every = f" on every rank ({len(judged)})" if len(judged) > 1 else ""
    if latest is None:
        return Verdict(name, "pass", f"no checkpoint existed yet: attempt {attempt} correctly started from step "
                       f"{j.got}{every}", "no checkpoint existed yet", evidence)
    if j.got == j.checkpoint_step:
        how = (f"at the latest checkpoint's own step ({j.checkpoint_step}), evaluating after loading it: the "
               "step trained after it reproduced its earlier value")
    else:
        how = f"right after the latest checkpoint (step {j.checkpoint_step})"
    return Verdict(name, "pass", f"attempt {attempt} resumed at step {j.got}, {how}{every} (rule: {j.rule})",
                   None, evidence)


# -- state-restored --------------------------------------------------------------------
def state_restored(timeline: Timeline, deterministic: bool = True, rtol: float = STATE_RTOL) -> list[Verdict]:
    """Per restart: a re-done step's state value (e.g. loss) equals the earlier attempt's.

    Catches a restore that set the step counter but not the weights.  Only for runs that
    record a state metric; a value that does not reproduce fails a ``deterministic``
    workload and is a warning for any other."""
    verdicts = []
    all_runs = runs(timeline)
    for i, (run_id, events) in enumerate(all_runs, 1):
        label = f"run {i}, " if len(all_runs) > 1 else ""
        refused = next((r for r in events if r.kind == "report" and r.data.get("state_refused")), None)
        if refused is not None:
            rank, why = next(iter(refused.data["state_refused"].items()))
            verdicts.append(Verdict(f"state-restored ({label}run)", "unverifiable",
                                    f"unverifiable: no state metric: rank {rank} reported {why}, not a number, so no "
                                    "restored state can be compared (report the loss as a float)",
                                    "unverifiable: no state metric", {"run_id": run_id,
                                                                      "refused": refused.data["state_refused"]}))
            continue
        reports = [e for e in events if e.kind == "report" and e.data.get("states")]
        if not reports:
            continue
        attempts = sorted({r.attempt for r in reports})
        for attempt in attempts[1:]:
            seen: dict[tuple[int, Any], tuple[int, float]] = {}
            for r in reports:
                if r.attempt < attempt:
                    for rank, step in steps_of(r).items():
                        value = (r.data["states"] or {}).get(str(rank))
                        if value is not None:
                            seen[(rank, step)] = (r.attempt, value)
            compared, mismatched = [], []
            at_checkpoint = _first_reports_at_a_checkpoint(events, attempt)
            for r in (x for x in reports if x.attempt == attempt):
                for rank, step in steps_of(r).items():
                    value = (r.data["states"] or {}).get(str(rank))
                    if value is None or (rank, step) not in seen or (id(r), rank) in at_checkpoint:
                        continue
                    was_attempt, was = seen[(rank, step)]
                    row = {"rank": rank, "step": step, "value": value, "earlier": was, "earlier_attempt": was_attempt}
                    compared.append(row)
                    if abs(value - was) > STATE_ATOL + rtol * abs(was):
                        mismatched.append(row)
            name = f"state-restored ({label}attempt {attempt})"
            evidence = {"run_id": run_id, "attempt": attempt, "compared": compared, "rtol": rtol,
                        "atol": STATE_ATOL}
            metric = _state_metric_of(events)
            if not compared:
                verdicts.append(Verdict(name, "n/a", f"not checked: attempt {attempt} re-did no step that an "
                                        f"earlier attempt had reported, so there is no {metric} to compare",
                                        None, evidence))
            elif mismatched:
                m = mismatched[0]
                what = (f"rank {m['rank']} reported {metric} {m['value']:.6g} at re-done step {m['step']} in attempt "
                        f"{attempt}, but {m['earlier']:.6g} in attempt {m['earlier_attempt']} ({len(mismatched)} of "
                        f"{len(compared)} re-done reports differ)")
                if deterministic:
                    verdicts.append(Verdict(name, "fail", f"state not restored: {what}: the step counter was restored, "
                                            "the model state was not", "state not restored", evidence))
                else:
                    verdicts.append(Verdict(name, "warning", f"state differs: {what} — a warning, not a failure: the "
                                            f"workload is not declared deterministic ({DETERMINISM_HINT}), and a data "
                                            "order or RNG it does not restore can explain it", "state differs",
                                            evidence))
            else:
                verdicts.append(Verdict(name, "pass", f"{len(compared)} re-done report(s) reproduced the earlier "
                                        f"attempt's {metric}", None, evidence))
    return verdicts


DETERMINISM_HINT = "--chaos-deterministic, or chaos.expect(deterministic=True)"


def _first_reports_at_a_checkpoint(events: list[Event], attempt: int) -> set[tuple[int, int]]:
    """(id of the report, rank) where ``rank``'s first report in ``attempt`` is at a step committed
    before it: an evaluation after loading that checkpoint, or that step trained again from
    it — both start from the state *after* the step, so neither can reproduce the value the
    earlier attempt reported *before* updating (resumed-from-latest judges it instead)."""
    committed: dict[int, set] = collections.defaultdict(set)
    firsts: dict[int, Event] = {}
    for r in (e for e in events if e.kind == "report"):
        for rank, step in steps_of(r).items():
            if r.attempt < attempt and r.data.get("checkpoint"):
                committed[rank].add(step)
            elif r.attempt == attempt:
                firsts.setdefault(rank, r)
    return {(id(r), rank) for rank, r in firsts.items() if _in(steps_of(r)[rank], committed[rank])}


def _state_metric_of(events: list[Event]) -> str:
    """The state metric the run's reports carry (auto: the one found), else the setting."""
    used = next((e.data["state_metric"] for e in events if e.kind == "report" and e.data.get("state_metric")), None)
    setting = next((e.data.get("state_metric") for e in events if e.kind == "controller_started"), None)
    return used or ("state metric (auto)" if setting == "auto" else setting) or "state"


# -- within-budget ---------------------------------------------------------------------
def _first_line(text: str | None) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return (lines[-1] if lines else "no error text")[:300]


def _faulted_run_event(timeline: Timeline, kind: str) -> Event | None:
    """The ``kind`` recorder event of the last run the faults hit."""
    hit = faulted_runs(timeline)
    return timeline.first(kind, where=lambda e: e.data.get("run_id") == hit[-1]) if hit else None


def within_budget(timeline: Timeline, expect: Expectation) -> Verdict:
    decisions = faulted_run_decisions(timeline)
    started = _faulted_run_event(timeline, "controller_started")
    fc = started.data.get("failure_config", {}) if started else {}
    att = attribute(timeline)
    primary = [(k, d) for k in att.by_fault if k not in att.lasting for d in att.charges(k)]
    by_class = collections.Counter(d.data.get("budget_class") for _, d in primary)
    raced = [(k, d) for k, d in primary if _raced(att.kinds.get(k), d)]
    platform = dict(collections.Counter(d.data.get("budget_class") for k in att.lasting for d in att.charges(k)))
    evidence = {"charged_by_faults": dict(by_class), "expected_charges": expect.charged, "failure_config": fc,
                "charged_by_node_recovery_faults": platform, "charge_outcomes": expect.charge_outcomes,
                "decisions": [{k: e.data.get(k) for k in ("run_id", "attempt", "decision", "budget_class", "count",
                                                          "limit")} | {"t": e.t} for e in decisions],
                "attributed": {k: [d.t for d in v] for k, v in att.by_fault.items()},
                "capacity_waits": [{"budget_class": d.data.get("budget_class"), "error_types": d.data.get("error_types"),
                                    "error": _first_line(d.data.get("error"))} for d in att.consequential],
                "unrelated": [{"attempt": d.attempt, "budget_class": d.data.get("budget_class"),
                               "error_types": d.data.get("error_types"), "error": _first_line(d.data.get("error"))}
                              | _reading_json(att, d) for d in att.unrelated],
                "attributed_why": {k: [_reading_json(att, d).get("why") for d in v] for k, v in att.by_fault.items()},
                "attributed_by_time_only": [{"attempt": d.attempt, "budget_class": d.data.get("budget_class"),
                                             "error_types": d.data.get("error_types")} | _reading_json(att, d)
                                            for d in att.by_time],
                "raced": [{"attempt": d.attempt, "fault": att.kinds[k], "charged": d.data.get("budget_class"),
                           "counted_as": KINDS[att.kinds[k]].budget_class} for k, d in raced]}
    gap = _decisions_gap(timeline)
    if decisions and any(not e.data.get("budget_class") for e in decisions):
        return Verdict("within-budget", "unverifiable", "unverifiable: a failure decision came without Ray's "
                       "[FailurePolicy] accounting", "unverifiable: no failure-policy record", evidence)
    if att.unrelated:
        d = att.unrelated[0]
        seen = att.reading(d)
        why = f": {seen.why}" if seen is not None else ""
        error = (seen.error if seen is not None else None) or _first_line(d.data.get("error"))
        return Verdict("within-budget", "fail", f"unrelated failure: attempt {d.attempt} failed with {error}"
                       f" (charged to {limit_name(d.data.get('budget_class') or '?')}), and no injected fault explains "
                       f"it{why} ({len(att.unrelated)} such decision(s))", "unrelated failure", evidence)
    raised = [e for e in decisions if e.data.get("decision") == "RAISE"]
    if raised:
        cls = raised[-1].data["budget_class"]
        count, limit = raised[-1].data.get("count"), raised[-1].data.get("limit")
        msg = (f"retry budget exhausted: {count} failure{'s' if count != 1 else ''} charged to "
               f"{limit_name(cls)}={limit}")
        if not expect.budget_exhausted:
            return Verdict("within-budget", "fail", msg, "retry budget exhausted", evidence)
        if expect.charged and cls not in expect.charged:
            return Verdict("within-budget", "fail", f"charged to the wrong budget class: {msg}, but the faults "
                           f"should have been charged to {sorted(expect.charged)}",
                           "charged to the wrong budget class", evidence)
        if limit is not None and count != limit + 1:
            return Verdict("within-budget", "fail", f"unexpected number of charged failures: Ray raised at count "
                           f"{count} with {limit_name(cls)}={limit}; exhaustion is the ({limit + 1})th failure",
                           "unexpected number of charged failures", evidence)
        if att.by_time:
            return _attributed_by_time_only(att, evidence)
        if gap is not None:
            return _decisions_missing(gap, msg + " (as this suite expects)", evidence)
        return Verdict("within-budget", "expected", msg + " (as this suite expects)", "retry budget exhausted",
                       evidence)
    if expect.budget_exhausted:
        msg = ("budget not exhausted: the suite expected the retry budget to run out, "
               f"but Ray kept retrying (charged {dict(by_class) or 'nothing'})")
        if gap is not None:
            return _decisions_missing(gap, msg, evidence)
        return Verdict("within-budget", "fail", msg, "budget not exhausted", evidence)
    counts = dict(by_class)
    want = {k: v for k, v in expect.charged.items() if v}
    race_note = ""
    if counts != want and raced:  # Ray's own race, only for the faults of a kind that has one
        moved = collections.Counter(KINDS[att.kinds[k]].budget_class for k, _ in raced)
        moved.subtract(collections.Counter(d.data.get("budget_class") for _, d in raced))
        relabelled = dict(collections.Counter(by_class) + moved)  # + keeps the positive counts only
        if relabelled == want:
            counts = relabelled
            race_note = "; " + "; ".join(
                f"the {att.kinds[k]} fault's failure (attempt {d.attempt}) was charged to "
                f"{limit_name(d.data.get('budget_class'))} instead, by a race in Ray: {KINDS[att.kinds[k]].race_why}"
                for k, d in raced)
    if counts != want:
        wrong = set(counts) - set(want)
        diagnosis = "charged to the wrong budget class" if wrong else "unexpected number of charged failures"
        msg = f"{diagnosis}: the injected faults were charged {counts or 'nothing'}, they should have charged {want}"
        if gap is not None and not wrong and all(n <= want[c] for c, n in counts.items()):
            return _decisions_missing(gap, msg, evidence)  # the ones short may be among the missing
        return Verdict("within-budget", "fail", msg, diagnosis, evidence)
    if att.lasting and expect.charge_outcomes is None:
        return Verdict("within-budget", "unverifiable", f"unverifiable: no measured outcomes: the node-recovery "
                       f"fault(s) were charged {platform or 'nothing'}, which is the platform's doing; say which "
                       "charges you measured and accept (chaos.expect(charge_outcomes=[...]))",
                       "unverifiable: no measured outcomes", evidence)
    if att.lasting and platform not in expect.charge_outcomes:
        return Verdict("within-budget", "fail", f"charge not among the measured outcomes: the node-recovery fault(s) "
                       f"were charged {platform or 'nothing'}; the outcomes measured for them: {expect.charge_outcomes}",
                       "charge not among the measured outcomes", evidence)
    limits = {c: v for c, v in (charged(timeline)).items()}
    parts = [f"{n} to {limit_name(c)}={limits[c]['limit'] if limits[c]['limit'] is not None else 'unlimited'}"
             for c, n in (by_class + collections.Counter(platform)).items()]
    extra = ""
    if att.consequential:
        waits = collections.Counter(d.data.get("budget_class") for d in att.consequential)
        extra = "; plus " + ", ".join(f"{n} to {limit_name(c)} while the worker group waited for the lost capacity"
                                      for c, n in waits.items())
    extra += race_note
    if att.lasting:
        extra += (f"; the node-recovery fault(s) charged {platform or 'nothing'} (what Ray made of the GPU failure "
                  "and the node's recovery, one of the measured outcomes)")
    if att.by_time:
        return _attributed_by_time_only(att, evidence)
    read = "charged " + (", ".join(parts) or "nothing") + ", as the faults should" + extra
    if gap is not None:
        return _decisions_missing(gap, read, evidence)
    return Verdict("within-budget", "pass", read, None, evidence)


def _decisions_gap(timeline: Timeline) -> Event | None:
    """Events of a faulted run nobody read (``events_unread``) or the recorder could not write
    (``events_lost``): a failure decision may be among them."""
    hit = set(faulted_runs(timeline))
    return next((g for g in timeline.events if g.source == "harness" and g.kind in ("events_unread", "events_lost")
                 and g.data.get("run_id") in hit), None)


def _decisions_missing(gap: Event, read: str, evidence: dict) -> Verdict:
    """Charges judged on the decisions read, where one may be missing: neither a pass nor a
    shortfall (fewer charges, no exhaustion) means anything."""
    diagnosis = "unverifiable: events lost" if gap.kind == "events_lost" else "unverifiable: events unread"
    return Verdict("within-budget", "unverifiable",
                   f"{diagnosis}: {_missing(gap)}, so a failure decision its controller made then would be "
                   f"missing (what was read: {read})", diagnosis, {**evidence, gap.kind: gap.data})


def _raced(kind: str | None, decision: Event) -> bool:
    """The decision is charged to the class its fault's kind may get by a race in Ray (catalog)."""
    entry = KINDS.get(kind or "")
    return bool(entry and entry.race_charge and decision.data.get("budget_class") == entry.race_charge)


def _reading_json(att: Attribution, d: Event) -> dict:
    seen = att.reading(d)
    return seen.to_json() if seen is not None else {}


def _attributed_by_time_only(att: Attribution, evidence: dict) -> Verdict:
    """A charge that would pass but rests on a decision claimed by its timing alone."""
    d = att.by_time[0]
    seen = att.reading(d)
    return Verdict("within-budget", "unverifiable", f"unverifiable: no failure evidence: attempt {d.attempt}'s failure "
                   f"(charged to {limit_name(d.data.get('budget_class') or '?')}) came after the fault, but "
                   f"{seen.why if seen is not None else 'nothing recorded says what failed'}: only its timing ties it "
                   f"to the fault, which cannot tell the fault's failure from another one "
                   f"({len(att.by_time)} such decision(s))", "unverifiable: no failure evidence", evidence)


def charged(timeline: Timeline) -> dict[str, dict]:
    """Failures Ray charged per budget class: the last decision's count and limit."""
    out: dict[str, dict] = {}
    for e in faulted_run_decisions(timeline):
        cls = e.data.get("budget_class")
        if cls:
            out[cls] = {"count": e.data.get("count"), "limit": e.data.get("limit"), "decision": e.data.get("decision")}
    return out


# -- recovery-time ---------------------------------------------------------------------
def recovery_time(timeline: Timeline, expect: Expectation) -> list[Verdict]:
    verdicts = []
    for i, m in enumerate(recovery_metrics(timeline)):
        evidence = dataclasses.asdict(m) | {"slo_detect_s": expect.slo_detect_s, "slo_recover_s": expect.slo_recover_s,
                                            "clock_offset_s": timeline.clock_offset}
        name = f"recovery-time (fault {i + 1})"
        if m.after_run_end:
            verdicts.append(Verdict(name, "unverifiable", "inconclusive: the fault landed after the run had already "
                                    "ended, so there was nothing to recover", "inconclusive", evidence))
            continue
        problems = []
        if expect.slo_detect_s is not None and m.time_to_detect is not None and m.time_to_detect > expect.slo_detect_s:
            problems.append(f"time to detect {_s(m.time_to_detect)} > SLO {expect.slo_detect_s:.1f} s")
        if m.time_to_detect is None:
            problems.append("Ray never noticed the fault")
        if expect.budget_exhausted:
            if problems:
                verdicts.append(Verdict(name, "fail", "recovery too slow: " + "; ".join(problems), "recovery too slow",
                                        evidence))
            else:
                verdicts.append(Verdict(name, "pass", f"detected in {_s(m.time_to_detect)} (SLO "
                                        f"{_s(expect.slo_detect_s)}); no recovery expected (budget exhausted)",
                                        None, evidence))
            continue
        if m.time_to_recover is None:
            problems.append("training never resumed after the fault")
        elif expect.slo_recover_s is not None and m.time_to_recover > expect.slo_recover_s:
            problems.append(f"time to recover {_s(m.time_to_recover)} > SLO {expect.slo_recover_s:.1f} s")
        summary = (f"detected in {_s(m.time_to_detect)}, attempt {m.recovered_attempt} started after "
                   f"{_s(m.time_to_restart)}, its first report after {_s(m.time_to_recover)}")
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
    """The run the faults hit ends FINISHED and its job SUCCEEDED (ERRORED/FAILED when
    exhaustion is expected)."""
    fin = _faulted_run_event(timeline, "run_finished")
    job = timeline.first("job_finished")
    status = job.data.get("status") if job else None
    evidence = {"run_state": fin.data.get("state") if fin else None, "job_status": status,
                "error": (fin.data.get("error") if fin else None) or (job.data.get("message") if job else None)}
    if fin is None:
        return Verdict("run-finished", "fail", "run did not finish: no final controller state was recorded "
                       f"(job status {status})", "run did not finish", evidence)
    state = fin.data.get("state")
    if expect.budget_exhausted:
        if state == "ERRORED" and status is None:
            return Verdict("run-finished", "unverifiable", "unverifiable: no job status: the run ended ERRORED, but "
                           "its job's final status was never read, so nothing shows the driver failed with it (a "
                           "driver that swallows the error ends SUCCEEDED)", "unverifiable: no job status", evidence)
        ok = state == "ERRORED" and status == "FAILED"
        return Verdict("run-finished", "expected" if ok else "fail",
                       "the run ended in a clean failure (ERRORED), as budget exhaustion should" if ok else
                       f"run did not fail cleanly: it ended {state} (job {status}), but budget exhaustion should end it "
                       "ERRORED",
                       None if ok else "run did not fail cleanly", evidence)
    if state == "FINISHED" and status == "SUCCEEDED":
        return Verdict("run-finished", "pass", "the run finished (FINISHED) and its job SUCCEEDED", None, evidence)
    if state == "FINISHED":
        return Verdict("run-finished", "fail", f"run failed: training FINISHED but the job ended {status}: "
                       f"{evidence['error']}", "run failed", evidence)
    return Verdict("run-finished", "fail", f"run failed: ended {state}: {evidence['error']}", "run failed", evidence)


# -- progress --------------------------------------------------------------------------
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
    return Verdict("progress", "fail", f"training stalled: no rank reported for {quiet_s:.0f} s (stall limit "
                   f"{limit_s:.0f} s) while waiting for {waiting_for}; last steps: {ranks}", "training stalled",
                   {"quiet_s": quiet_s, "stall_limit_s": limit_s, "last_steps": steps, "waiting_for": waiting_for})


def did_not_resume(what: str, detail: str) -> Verdict:
    """Ray never noticed the fault, or never restarted after it."""
    return Verdict("progress", "fail", f"did not resume: {what} ({detail})", "did not resume",
                   {"awaited": what, "detail": detail})


def ended_before_fault(fault: int, trigger: str, ended: Event) -> Verdict:
    """The run ended before a fault's trigger fired: nothing of that fault can be judged,
    and that is the finding (a run too short for its faults, or one that ended early)."""
    return Verdict("progress", "fail", f"run ended before the fault: fault {fault} waited {trigger}, but "
                   f"{ended.describe()} came first; no fault {fault} was injected", "run ended before the fault",
                   {"fault": fault, "trigger": trigger, "ended": ended.to_json()})


def did_not_end(events: list[Event], waited_s: float, driver_exit_s: float, job_status: str | None) -> Verdict:
    """The finish phase's deadline passed: the run never ended within ``waited_s``, or its
    driver had not exited ``driver_exit_s`` after Train's run had."""
    fins = [e for e in events if e.kind == "run_finished"]
    evidence = {"waited_s": waited_s, "job_status": job_status, "last_steps": last_steps(events)}
    if fins:
        fin = fins[-1]
        evidence["waited_s"] = driver_exit_s
        return Verdict("run-finished", "fail", f"driver did not exit: Train's run ended {fin.data.get('state')}, "
                       f"but {driver_exit_s:.0f} s later its job was still {job_status or 'not ended'} (the script "
                       "hangs after fit() returned)", "driver did not exit", evidence)
    steps = ", ".join(f"rank {r} at step {s}" for r, s in sorted(evidence["last_steps"].items())) or "no report"
    return Verdict("run-finished", "fail", f"run did not finish within {waited_s:.0f} s after the last fault "
                   f"(job {job_status or 'not ended'}; last steps: {steps})", "run did not finish", evidence)


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
    errors = "; ".join(dict.fromkeys(_first_line(d.data.get("error")) for d in streak))
    return Verdict("progress", "fail", f"crash loop: {failures} failures in a row without a step beyond "
                   f"{best if best is not None else 'the start'}, each retried (unlimited budget): {errors}",
                   "crash loop", {"decisions": [{"t": d.t, "attempt": d.attempt, "error_types": d.data.get("error_types")}
                                                for d in streak], "best_step": best})


def _limited(limit: Any) -> bool:
    """A decision's limit that ends retries: a number >= 0 (Ray logs inf, -1 or nothing for unlimited)."""
    try:
        return 0 <= float(limit) < float("inf")
    except (TypeError, ValueError):
        return False


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


# -- final-state -----------------------------------------------------------------------
# Metrics a workload reports to name its whole state (the reference workload's digest of
# its weights and optimizer), read from the reports' metrics besides the state metric.
STATE_DIGEST_METRICS = ("state_digest",)
# The parts of a workload's state a restore can lose, each with what losing it means: a
# workload that reports digest_<part> of the state each step *began* from (the reference
# workload does) lets the state-trajectory verdict name the part.  Causes first: the weights
# follow from every other part, the optimizer's state from the weights and the schedule, so
# where several differ at once the first of this order is named.
DIGEST_PARTS = ("data", "rng", "scheduler", "optimizer", "weights")
PART_CAUSES = {
    "data": "the data position (sampler, cursor) was not restored",
    "rng": "the RNG state was not restored",
    "scheduler": "the LR scheduler's state was not restored",
    "optimizer": "the optimizer's state (momentum, ...) was not restored",
    "weights": "the model's weights were not restored",
}
TRAJECTORY_METRICS = (*STATE_DIGEST_METRICS, *(f"digest_{p}" for p in DIGEST_PARTS))


@dataclasses.dataclass
class Baseline:
    """A fault-free run of the same workload and seed: each rank's final state, or why
    there is none (``error``).  chaos.baseline makes and caches it."""

    key: str
    final: dict[int, dict] = dataclasses.field(default_factory=dict)  # rank -> {"step": s, "state": {metric: value}}
    # rank -> [[step, {metric: value}], ...] in the order reported (trajectory_of)
    trajectory: dict[int, list] = dataclasses.field(default_factory=dict)
    job_id: str | None = None
    made_at: str | None = None
    run_name: str | None = None
    storage_path: str | None = None
    cached: bool = False
    error: str | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Baseline":
        fields = {f.name for f in dataclasses.fields(cls)}
        b = cls(**{k: v for k, v in data.items() if k in fields})
        b.final = {int(rank): v for rank, v in (b.final or {}).items()}
        b.trajectory = {int(rank): v for rank, v in (b.trajectory or {}).items()}
        return b


def _faulted_run_reports(timeline: Timeline) -> tuple[list[Event], str | None]:
    """The reports of the (last) Train run the faults hit, and its state metric."""
    hit = faulted_runs(timeline)
    events = dict(runs(timeline)).get(hit[-1]) if hit else None
    if not events:
        return [], None
    started = next((e for e in events if e.kind == "controller_started"), None)
    return [e for e in events if e.kind == "report"], started.data.get("state_metric") if started else None


def _rank_states(report: Event, metric: str | None, digests: tuple[str, ...]) -> dict[int, tuple[Any, dict]]:
    """rank -> (step, state) of one report.  The state is the recorded state metric (per rank)
    and, for the rank whose whole metrics the recorder keeps (the report's first rank), the
    ``digests`` and the state metric as reported (a hex hash the recorder's numeric view drops)."""
    kept = next(iter(report.data.get("steps") or {}), None)
    out = {}
    for rank, step in steps_of(report).items():
        state = {}
        value = (report.data.get("states") or {}).get(str(rank))
        if metric and value is not None:
            state[metric] = value
        if str(rank) == str(kept):
            reported = report.data.get("metrics") or {}
            for name in (*([metric] if metric else []), *digests):
                if name not in state and reported.get(name) is not None:
                    state[name] = reported[name]
        out[rank] = (step, state)
    return out


def final_states(timeline: Timeline) -> dict[int, dict]:
    """Each rank's last report in the (last) Train run the faults hit: {"step": s, "state": {metric: value}}
    (the state as ``_rank_states`` reads it, with the STATE_DIGEST_METRICS)."""
    reports, metric = _faulted_run_reports(timeline)
    out: dict[int, dict] = {}
    for r in reports:
        for rank, (step, state) in _rank_states(r, metric, STATE_DIGEST_METRICS).items():
            out[rank] = {"step": step, "state": state}
    return out


def trajectory_of(timeline: Timeline) -> dict[int, list]:
    """Each rank's (step, state) at every report of the run the faults hit, in report order
    (a fault-free run's is the baseline the state-trajectory verdict follows)."""
    reports, metric = _faulted_run_reports(timeline)
    out: dict[int, list] = {}
    for r in reports:
        for rank, (step, state) in _rank_states(r, metric, TRAJECTORY_METRICS).items():
            out.setdefault(rank, []).append([step, state])
    return out


def _same_value(a: Any, b: Any, rtol: float = STATE_RTOL) -> bool:
    """Strings (digests) exactly; numbers within the tolerance."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(a - b) <= STATE_ATOL + rtol * abs(b)
    return a == b


def _fmt(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def final_state_matches(timeline: Timeline, baseline: Baseline, rtol: float = STATE_RTOL) -> Verdict:
    """The finished run's final state (each rank's step and state at its last report)
    equals a fault-free run's of the same workload and seed: a restart that restored the
    step but not the weights, optimizer, RNG or data order ends somewhere else."""
    name = "final-state"
    fin = _faulted_run_event(timeline, "run_finished")
    ended = fin.data.get("state") if fin else None
    mine = final_states(timeline)
    evidence = {"final": mine, "baseline": baseline.to_json(), "rtol": rtol, "atol": STATE_ATOL}
    if ended != "FINISHED":
        how = f"it ended {ended}" if ended else "no final controller state was recorded"
        return Verdict(name, "unverifiable", f"unverifiable: the run did not finish ({how}), so it has no final "
                       "state to compare with the fault-free baseline", "unverifiable: run did not finish", evidence)
    if not any(v["state"] for v in mine.values()):
        return Verdict(name, "unverifiable", "unverifiable: no state metric: the run's reports carry no state value "
                       f"(--chaos-state-metric, or a {' / '.join(STATE_DIGEST_METRICS)} metric), so its final state "
                       "cannot be compared", "unverifiable: no state metric", evidence)
    unusable = _baseline_unusable(timeline, baseline)
    if unusable:
        return Verdict(name, "unverifiable", unusable, "unverifiable: no baseline", evidence)
    differ, compared, uncompared, stateless = [], [], [], []
    for rank in sorted(set(mine) | set(baseline.final)):
        got, want = mine.get(rank), baseline.final.get(rank)
        if got is None or want is None:
            where = "the faulted run" if got is None else "the baseline"
            differ.append(f"rank {rank} never reported in {where}")
            continue
        common = sorted(set(got["state"]) & set(want["state"]))
        values = ", ".join(f"{m} {_fmt(got['state'][m])}" for m in common)
        if got["step"] != want["step"]:
            differ.append(f"rank {rank} finished at step {got['step']}, the baseline at step {want['step']}")
            continue
        bad = [m for m in common if not _same_value(got["state"][m], want["state"][m], rtol)]
        if bad:
            differ.append(f"rank {rank} at step {got['step']}: " + ", ".join(
                f"{m} {_fmt(got['state'][m])} but {_fmt(want['state'][m])} in the baseline" for m in bad))
        elif common:
            compared.append(f"rank {rank} at step {got['step']} ({values})")
        elif got["state"] or want["state"]:  # a state on one side only: this rank's is not compared
            uncompared.append(f"rank {rank} at step {got['step']} reported {_names(got['state'])} in the faulted run "
                              f"but {_names(want['state'])} in the baseline")
        else:
            stateless.append(rank)
    origin = _origin(baseline)
    if differ:
        return Verdict(name, "fail", "final state differs from the fault-free run's: " + "; ".join(differ)
                       + f" ({origin})", "final state differs", evidence)
    if uncompared and compared:
        return Verdict(name, "unverifiable", "unverifiable: no state metric in common for every rank: "
                       + "; ".join(uncompared) + f", so its final state cannot be compared ({origin})",
                       "unverifiable: no state metric", evidence)
    if not compared:
        return Verdict(name, "unverifiable", "unverifiable: no state metric: the run and its baseline report no "
                       "state metric in common", "unverifiable: no state metric", evidence)
    alike = (f"; rank(s) {', '.join(map(str, stateless))} reported no state value in either run, their steps "
             "alike" if stateless else "")
    return Verdict(name, "pass", "every rank ended in the fault-free run's state: " + "; ".join(compared) + alike
                   + f" ({origin})", None, evidence)


def _names(state: dict) -> str:
    return ", ".join(sorted(state)) or "no state value"


def _baseline_unusable(timeline: Timeline, baseline: Baseline) -> str | None:
    """Why ``baseline`` cannot be compared with this run (no baseline made, or one that shared
    the run's Train run and so resumed from its checkpoints or gave it its own), else None."""
    if baseline.error:
        return f"unverifiable: no baseline could be made: {baseline.error}"
    started = _faulted_run_event(timeline, "controller_started")
    if started is not None and baseline.run_name and (started.data.get("run_name"), started.data.get(
            "storage_path")) == (baseline.run_name, baseline.storage_path):
        return (f"unverifiable: no baseline could be made: the fault-free run used the same Train run "
                f"({baseline.storage_path}/{baseline.run_name}), so one resumed from the other's checkpoints; give "
                "each run of the script its own name")
    return None


def _origin(baseline: Baseline) -> str:
    return f"fault-free baseline job {baseline.job_id} of {baseline.made_at}" + (", cached" if baseline.cached else "")


# -- state-trajectory ------------------------------------------------------------------
def state_trajectory(timeline: Timeline, baseline: Baseline, deterministic: bool = True,
                     rtol: float = STATE_RTOL) -> Verdict:
    """Every report of the run the faults hit, step by step and rank by rank, reproduces the
    fault-free run's state at the same step (the state metric within ``rtol``, digests
    exactly).  A restore that brought the step back but not the optimizer, scheduler, RNG or
    data position leaves the trajectory at the first step that depends on the lost part —
    a step the state-restored verdict (re-done steps only) never sees.  A run that left the
    baseline *before* any fault does not reproduce it at all: unverifiable, not judged."""
    name = "state-trajectory"
    reports, metric = _faulted_run_reports(timeline)
    fault = timeline.first("fault_injected")
    base = {rank: {_step_key(step): state for step, state in rows} for rank, rows in baseline.trajectory.items()}
    first_attempt = min((r.attempt for r in reports), default=0)
    compared, first_off, off_before = [], None, None
    for r in reports:
        for rank, (step, state) in _rank_states(r, metric, TRAJECTORY_METRICS).items():
            want = base.get(rank, {}).get(_step_key(step))
            common = sorted(set(state) & set(want or {}))
            if not common:
                continue
            bad = [m for m in common if not _same_value(state[m], want[m], rtol)]
            row = {"attempt": r.attempt, "rank": rank, "step": step, "metrics": common, "differ": bad,
                   "got": {m: state[m] for m in bad}, "baseline": {m: want[m] for m in bad},
                   "after_fault": fault is not None and r.t >= fault.t}
            compared.append(row)
            if bad and not row["after_fault"] and off_before is None:
                off_before = row
            if bad and row["after_fault"] and first_off is None:
                first_off = row
    evidence = {"baseline_key": baseline.key, "rtol": rtol, "atol": STATE_ATOL, "compared": len(compared),
                "first_divergence": first_off, "before_the_fault": off_before}
    unusable = _baseline_unusable(timeline, baseline)
    if unusable:
        return Verdict(name, "unverifiable", unusable, "unverifiable: no baseline", evidence)
    if not any(state for r in reports for _, state in _rank_states(r, metric, TRAJECTORY_METRICS).values()):
        return Verdict(name, "unverifiable", "unverifiable: no state metric: the run's reports carry no state value "
                       "(--chaos-state-metric, or digest_<part> metrics), so its trajectory cannot be followed",
                       "unverifiable: no state metric", evidence)
    if off_before is not None:
        return Verdict(name, "unverifiable", f"unverifiable: baseline not reproduced: {_divergence(off_before)} "
                       f"before any fault was injected, so the workload does not reproduce its fault-free run at rtol "
                       f"{rtol:g} and nothing after the fault can be blamed on the restore (seed every source of "
                       "randomness, or allow more with --chaos-state-rtol)", "unverifiable: baseline not reproduced",
                       evidence)
    restarted = [c for c in compared if c["attempt"] > first_attempt]
    unfollowed = sorted({r.attempt for r in reports if r.attempt > first_attempt} - {c["attempt"] for c in restarted})
    if first_off is None and restarted and unfollowed:  # one attempt's steps do not vouch for another's
        return Verdict(name, "unverifiable", f"unverifiable: no step to compare in attempt(s) "
                       f"{', '.join(map(str, unfollowed))}: they reported no step the fault-free run reported with a "
                       f"state value, so their restored state is not followed ({_origin(baseline)})",
                       "unverifiable: no step to compare", evidence)
    if first_off is None and not restarted:
        if not any(r.attempt > first_attempt for r in reports):
            return Verdict(name, "n/a", "not checked: no attempt after the first reported, so no restored state "
                           "to follow", None, evidence)
        return Verdict(name, "unverifiable", "unverifiable: no step to compare: the restarted attempts reported no "
                       f"step the fault-free run reported with a state value ({_origin(baseline)})",
                       "unverifiable: no step to compare", evidence)
    if first_off is not None:
        what = f"{_divergence(first_off)} ({_origin(baseline)})"
        parts = [p for p in DIGEST_PARTS if f"digest_{p}" in first_off["differ"]]
        why = (PART_CAUSES[parts[0]] + (f" (digest_{parts[0]} differs" + (
            f"; so does {', '.join('digest_' + p for p in parts[1:])}" if parts[1:] else "") + ")")
            if parts else "usually the optimizer's or LR scheduler's state, the RNG or the data position was not "
            "restored")
        if deterministic:
            return Verdict(name, "fail", f"state not restored: {what}: {why}", "state not restored", evidence)
        return Verdict(name, "warning", f"state differs: {what}: {why} — a warning, not a failure: the workload is "
                       f"not declared deterministic ({DETERMINISM_HINT})", "state differs", evidence)
    steps = sorted({c["step"] for c in restarted})
    metrics = sorted({m for c in restarted for m in c["metrics"]})
    return Verdict(name, "pass", f"{len(restarted)} report(s) of the restarted attempt(s) at steps {_fmt(steps[0])}.."
                   f"{_fmt(steps[-1])} followed the fault-free trajectory ({', '.join(metrics)}; rtol {rtol:g}; "
                   f"{_origin(baseline)})", None, evidence)


def _step_key(step: Any) -> Any:
    """A step as a lookup key: a float step equal to an integer is that integer; fractional
    steps are rounded to 6 places (JSON round-trips and epoch fractions)."""
    if isinstance(step, float):
        return int(step) if step.is_integer() else round(step, 6)
    return step


def _divergence(row: dict) -> str:
    values = ", ".join(f"{m} {_fmt(row['got'][m])} but {_fmt(row['baseline'][m])} in the baseline" for m in row["differ"])
    return f"step {_fmt(row['step'])} (attempt {row['attempt']}, rank {row['rank']}) left the fault-free trajectory: {values}"


# -- automatic node recovery (xid) -----------------------------------------------------------
def node_recovery_chain(timeline: Timeline) -> list[Verdict]:
    """Per ``xid`` fault, the links only the platform can make: the node agent acted on the
    Xid (its condition / label / taint on the node) within its SLO, and the node came back
    (Ready with a new boot id, or a new node) within the recovery SLO.  Missing evidence is
    unverifiable; an agent that never acted fails both."""
    out = []
    for i, fault in enumerate((e for e in timeline.of("fault_injected") if e.data.get("fault") == "xid"), 1):
        lid = fault.data.get("ledger_id")

        def mine(kind: str) -> Event | None:
            return timeline.first(kind, where=lambda e: e.data.get("ledger_id") == lid)

        logged, acted, silent = mine("xid_logged"), mine("node_agent_acted"), mine("node_agent_silent")
        back, stuck, broken = mine("node_recovered"), mine("node_not_recovered"), mine("chain_watch_failed")
        no_evidence = ("unverifiable: no node agent evidence: " + (
            f"the watch of the node failed: {broken.data.get('error')}" if broken is not None else
            "nothing watched the node's conditions, labels and taints (it needs the Kubernetes API)"))
        since = logged.t if logged is not None else fault.t  # the line, not the pod that wrote it
        xid = logged.data.get("xid") if logged else "?"
        slo_agent, slo_back = (logged.data.get("agent_slo_s"), logged.data.get("recover_slo_s")) if logged else (None,
                                                                                                            None)
        evidence = {"xid": xid, "line": logged.data.get("line") if logged else None,
                    "kernel_log": logged.data.get("written") if logged else None, "agent_slo_s": slo_agent,
                    "recover_slo_s": slo_back}
        name = f"node-agent (fault {i})"
        if acted is not None:
            after = acted.t - since
            signal = ", ".join(f"{k} {v}" for k, v in acted.data.items() if k in ("condition", "label", "taints"))
            evidence.update(agent_after_s=round(after, 3), signals={k: acted.data.get(k) for k in
                                                                     ("condition", "label", "taints")})
            if slo_agent is not None and after > slo_agent:
                out.append(Verdict(name, "fail", f"node agent too slow: it acted on Xid {xid} after {after:.1f} s "
                                   f"(SLO {slo_agent:.1f} s): {signal}", "node agent too slow", evidence))
            else:
                out.append(Verdict(name, "pass", f"the node agent acted on Xid {xid} after {after:.1f} s: {signal}",
                                   None, evidence))
        elif silent is not None:
            evidence["seen"] = silent.data.get("seen")
            out.append(Verdict(name, "fail", f"node agent never acted: automatic node recovery did not act on Xid "
                               f"{xid} within {silent.data.get('waited_s', 0):.0f} s: {silent.data.get('seen')}",
                               "node agent never acted", evidence))
        else:
            out.append(Verdict(name, "unverifiable", no_evidence, "unverifiable: no node agent evidence", evidence))
        name = f"node-recovered (fault {i})"
        if back is not None:
            took = back.t - (acted.t if acted is not None else since)
            evidence.update(node_back_after_s=round(took, 3), **{k: back.data.get(k) for k in
                                                                  ("action", "node_after", "boot_id_after")})
            how = (f"rebooted (boot id {back.data.get('boot_id_before')} -> {back.data.get('boot_id_after')})"
                   if back.data.get("action") == "reboot" else f"replaced by node {back.data.get('node_after')}")
            if slo_back is not None and took > slo_back:
                out.append(Verdict(name, "fail", f"node recovery too slow: node {back.data.get('node')} {how} "
                                   f"{took:.1f} s after the agent acted (SLO {slo_back:.1f} s)", "node recovery too slow",
                                   evidence))
            else:
                out.append(Verdict(name, "pass", f"node {back.data.get('node')} {how} {took:.1f} s after the agent "
                                   "acted", None, evidence))
        elif stuck is not None or silent is not None:
            why = (f"waited {stuck.data.get('waited_s', 0):.0f} s: {stuck.data.get('seen')}" if stuck is not None
                   else "the node agent never acted, so nothing recovered it")
            out.append(Verdict(name, "fail", f"node not recovered: {why}", "node not recovered", evidence))
        else:
            out.append(Verdict(name, "unverifiable", no_evidence, "unverifiable: no node agent evidence", evidence))
    return out


# -- all of it -------------------------------------------------------------------------
def preemption_window(timeline: Timeline, expect: Expectation) -> list[Verdict]:
    """Per preemption: when Ray was told, the deadline, when the node went, and whether a
    checkpoint was committed inside that window (checked when the suite says it must be)."""
    out, windows = [], []  # the earlier preemptions' windows: a checkpoint there was no periodic one
    for i, notice in enumerate(timeline.of("preemption_notice"), 1):
        d = notice.data
        gone = timeline.first("node_dead", after=notice.t, where=lambda e: e.data.get("node_id") == d["node_id"])
        end = gone.t if gone is not None else d["deadline"]
        commits = [r for r in timeline.of("report") if r.data.get("checkpoint") and notice.t <= r.t <= end]
        steps = sorted({s for r in commits for s in steps_of(r).values()})
        evidence = {"notice_t": notice.t, "deadline_t": d["deadline"], "window_s": d["window_s"], "via": d["via"],
                    "node_gone_t": gone.t if gone else None, "node_gone_after_s": gone.t - notice.t if gone else None,
                    "death_reason": gone.data.get("death_reason") if gone else None, "checkpoint_steps": steps,
                    "checkpoints_at_s": [round(r.t - notice.t, 3) for r in commits]}
        when = (f"notice at +0 s ({d['via']}), deadline +{d['window_s']:.1f} s, node gone "
                + (f"+{gone.t - notice.t:.1f} s" if gone else "not seen"))
        inside = (f"checkpoint committed inside the window at step {', '.join(map(str, steps))} "
                  f"(+{', +'.join(f'{x:.1f}' for x in evidence['checkpoints_at_s'])} s)" if commits
                  else "no checkpoint committed inside the window")
        name = f"preemption-window (preemption {i})"
        want = expect.checkpoint_in_window
        before = sorted({s for r in timeline.of("report") if r.data.get("checkpoint") and r.t < notice.t
                         and not any(a <= r.t <= b for a, b in windows) for s in steps_of(r).values()})
        windows.append((notice.t, end))
        cadence = _cadence(before)
        periodic = [s for s in steps if cadence is not None and _on_cadence(s, before[-1], cadence)]
        # When each committed checkpoint reached storage: a rank's report with it in a poll (the
        # rank persisted it); one persisted before the notice was not made because of it.
        persisted = {r.data["checkpoint"]: min((p.t for p in timeline.of("checkpoint_persisted")
                                                if p.data.get("checkpoint") == r.data["checkpoint"]), default=None)
                     for r in commits}
        # The notice is the earliest a rank could have learnt of it (Train's watcher passes it on
        # later, and the controller sees a rank's echo later still, often in the same poll as the
        # rank's checkpoint): only a checkpoint on storage before it was surely not made for it.
        early = {s for r in commits for s in steps_of(r).values()
                 if persisted[r.data["checkpoint"]] is not None and persisted[r.data["checkpoint"]] < notice.t}
        evidence.update(periodic_checkpoint_steps=before, cadence=cadence, on_cadence=periodic,
                        persisted_at_s={str(k): (round(v - notice.t, 3) if v is not None else None)
                                        for k, v in persisted.items()}, persisted_before_notice=sorted(early))
        explained = set(periodic) | early
        if want is None:
            out.append(Verdict(name, "n/a", f"{when}; {inside} (not required either way)", evidence=evidence))
        elif want and commits and any(v is None for v in persisted.values()) and not explained >= set(steps):
            out.append(Verdict(name, "unverifiable", f"unverifiable: no persist record: {inside}, but the recorder saw "
                               "no rank persist it, so nothing tells whether it was written before or after the "
                               f"notice ({when})", "unverifiable: no persist record", evidence))
        elif want and commits and early and explained >= set(steps):
            first = min(early)
            r = next(r for r in commits if first in steps_of(r).values())
            out.append(Verdict(name, "fail", f"no just-in-time checkpoint: {inside}, but the checkpoint at step "
                               f"{first} was already on storage {notice.t - persisted[r.data['checkpoint']]:.1f} s "
                               "before the notice (a rank persisted it then; Ray committed it once every rank had "
                               f"reported), so the notice did not cause it ({when})", "no just-in-time checkpoint",
                               evidence))
        elif want and commits and cadence is None:
            out.append(Verdict(name, "unverifiable", f"unverifiable: {inside}, but no checkpoint was committed before "
                               "the notice, so nothing tells a periodic checkpoint from one made because of the notice "
                               f"({when})", "unverifiable: no checkpoint cadence", evidence))
        elif want and commits and len(periodic) == len(steps):
            out.append(Verdict(name, "fail", f"no just-in-time checkpoint: {inside}, but step "
                               f"{', '.join(map(str, periodic))} falls on the script's periodic cadence (every "
                               f"{cadence} steps from {before[-1]}), which explains it without the notice ({when})",
                               "no just-in-time checkpoint", evidence))
        elif bool(commits) == want:
            out.append(Verdict(name, "pass", f"{when}; {inside}" + (
                f", off the periodic cadence (every {cadence} steps from {before[-1]})" if want else ""),
                evidence=evidence))
        else:
            diagnosis = "no just-in-time checkpoint" if want else "checkpoint inside the preemption window"
            out.append(Verdict(name, "fail", f"{diagnosis}: {when}; {inside}", diagnosis, evidence))
    return out


def _cadence(steps: list) -> Any:
    """The periodic checkpoint interval the committed ``steps`` show: their most common
    difference, or the one step itself (counted from 0); None with no checkpoint."""
    if not steps:
        return None
    diffs = collections.Counter(b - a for a, b in zip(steps, steps[1:]) if b > a)
    return diffs.most_common(1)[0][0] if diffs else steps[0]


def _on_cadence(step: Any, last: Any, cadence: Any) -> bool:
    if not cadence or step <= last:
        return False
    k = round((step - last) / cadence)
    return k >= 1 and _same_step(last + k * cadence, step)


def verdicts_for(timeline: Timeline, expect: Expectation, finished: bool = True) -> list[Verdict]:
    """Every verdict; for a run stopped because it stalled (``finished=False``), only the
    restarts it made — the stall itself is the finding about how it ended."""
    det, rtol = expect.deterministic, expect.state_rtol
    final = [final_state_matches(timeline, expect.final_state, rtol)] if expect.final_state is not None else []
    if expect.trajectory is not None:
        final.insert(0, state_trajectory(timeline, expect.trajectory, det, rtol))
    resumed = resumed_from_latest(timeline, det, expect.trajectory)
    heads = head_losses(timeline, expect)
    if not finished:
        return [*heads, *resumed, *state_restored(timeline, det, rtol), *node_recovery_chain(timeline), *final]
    return [*heads, *resumed, *state_restored(timeline, det, rtol), within_budget(timeline, expect),
            *recovery_time(timeline, expect), *preemption_window(timeline, expect), *node_recovery_chain(timeline),
            run_finished(timeline, expect), *final]


def check(verdicts: list[Verdict], unverifiable: str = "fail") -> None:
    """Raise VerificationError listing every failing verdict (first failure's diagnosis leads).

    With ``unverifiable="fail"`` (the default) a verdict that could not be checked fails
    the test with its reason; ``"warn"`` lets it through, still shown in the report."""
    failing = [v for v in verdicts if v.fails(unverifiable)]
    failing.sort(key=lambda v: v.status != "fail")
    if failing:
        raise VerificationError("\n".join(v.message for v in failing), verdicts)

"""One Train run's reports, typed once, with the per-rank views the resume and state rules
read (which step followed which, the reporting stride, where a value was reported)."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from chaos.timeline import Event
from chaos.verdicts import events as ev
from chaos.verdicts.expect import Expect
from chaos.verdicts.states import Baseline
from chaos.verdicts.tolerance import finite, same_state, same_step, step_in, step_key

Step = ev.Step


@dataclasses.dataclass(frozen=True)
class Row:
    """One report round: its event, its typed payload and each rank's step (ranks that
    reported no step left out)."""

    event: Event
    data: ev.Report
    steps: dict[int, Step]

    @classmethod
    def of(cls, event: Event) -> Row:
        data = ev.report(event)
        if data.steps is None:  # a single-rank record
            steps = {} if data.step is None else {0: data.step}
        else:
            steps = {rank: step for rank, step in data.steps.items() if step is not None}
        return cls(event, data, steps)

    @property
    def attempt(self) -> int:
        return self.data.attempt if self.data.attempt is not None else -1

    @property
    def t(self) -> float:
        return self.event.t

    @property
    def checkpoint(self) -> str | None:
        return self.data.checkpoint

    def value(self, rank: int) -> float | None:
        """The rank's state value in this report, where it is a finite number."""
        value = (self.data.states or {}).get(rank)
        return value if finite(value) else None

    def named_ranks(self) -> set[int]:
        """Every rank the report names, with a step or without one."""
        return set(self.data.steps or {}) | set(self.steps)


@dataclasses.dataclass(frozen=True)
class Strides:
    """A rank's reporting stride before an attempt: the one step difference between
    consecutive reports of one attempt, or None with every difference seen (``seen``)."""

    seen: tuple[Any, ...]

    @property
    def regular(self) -> Any:
        return self.seen[0] if len(self.seen) == 1 else None


class RunReports:
    """One run's reports; ``expect`` gives the determinism and tolerance of its value
    comparisons, and the fault-free baseline whose values decide where no earlier attempt
    reported a step."""

    def __init__(self, events: list[Event], expect: Expect, baseline: Baseline | None = None):
        self.expect = expect
        self.rtol = expect.rtol
        self.events = events
        self.started = next((ev.ControllerStarted.model_validate(e.data) for e in events
                             if e.kind == ev.EventKind.CONTROLLER_STARTED), None)
        self.rows = [Row.of(e) for e in events if e.kind == ev.EventKind.REPORT]
        self.stepped = [r for r in self.rows if r.steps]
        self.persisted = [ev.CheckpointPersisted.model_validate(e.data) for e in events
                          if e.kind == ev.EventKind.CHECKPOINT_PERSISTED]
        starts = {e.data.get("attempt") for e in events if e.kind == ev.EventKind.ATTEMPT_STARTED}
        # an attempt whose start event was lost (events_lost) still shows in its reports
        self.attempts = sorted(a for a in starts | {r.attempt for r in self.rows} if a is not None and a >= 0)
        self.placement = {e.data.get("attempt"): {int(p["rank"]) for p in e.data.get("placement") or []
                                                  if p.get("rank") is not None}
                          for e in events if e.kind == ev.EventKind.ATTEMPT_STARTED}
        self.baseline_values = _baseline_values(baseline, self.started.state_metric if self.started else None)

    # -- which reports --------------------------------------------------------------------
    def of_attempt(self, attempt: int) -> list[Row]:
        return [r for r in self.rows if r.attempt == attempt]

    def first_of(self, attempt: int) -> Row | None:
        return next((r for r in self.stepped if r.attempt == attempt), None)

    def commits_before(self, attempt: int) -> list[Row]:
        return [r for r in self.rows if r.attempt < attempt and r.checkpoint]

    def ranks_in(self, attempt: int) -> set[int]:
        """Every rank a report of ``attempt`` names, with a step or without one."""
        return {rank for r in self.of_attempt(attempt) for rank in r.named_ranks()}

    def world_size(self, attempt: int) -> int | None:
        """How many ranks ``attempt`` ran (its placement), None where its start was not seen."""
        return len(self.placement[attempt]) if self.placement.get(attempt) else None

    def resized_between(self, earlier: int, later: int) -> tuple[int, int] | None:
        """(the two world sizes) where an elastic run ran ``earlier`` and ``later`` at different
        sizes, else None (the same size, or a size not known)."""
        a, b = self.world_size(earlier), self.world_size(later)
        return (a, b) if a is not None and b is not None and a != b else None

    def ranks_of(self, attempt: int) -> set[int]:
        """The ranks ``attempt`` ran (its placement; else the ranks its reports name)."""
        return self.placement.get(attempt) or self.ranks_in(attempt)

    def first_step_of(self, attempt: int, rank: int) -> tuple[Row, Step] | None:
        """``rank``'s first report in ``attempt`` that carries its step, and that step."""
        return next(((r, r.steps[rank]) for r in self.stepped if r.attempt == attempt and rank in r.steps), None)

    def run_first_step(self, rank: int, before: int) -> Step | None:
        """The first step ``rank`` reported in the attempts before ``before``; for a rank that
        never reported before (an elastic run's new rank), the first step any rank reported."""
        own = next((r.steps[rank] for r in self.stepped if r.attempt < before and rank in r.steps), None)
        if own is not None:
            return own
        return next((min(r.steps.values()) for r in self.stepped if r.attempt < before), None)

    def stepped_ever(self, rank: int) -> bool:
        return any(rank in r.steps for r in self.stepped)

    # -- steps around a checkpoint ----------------------------------------------------------
    def after(self, row: Row) -> Iterator[Row]:
        """The stepped reports after ``row`` in its own attempt."""
        seen = False
        for r in self.rows:
            if r is row:
                seen = True
            elif seen and r.attempt == row.attempt and r.steps:
                yield r

    def next_after(self, commit: Row, rank: int, ck: Step) -> Step | None:
        """The step ``rank`` reported right after ``commit`` in the attempt that committed it,
        past any report at the checkpoint's own step (``ck``)."""
        return next((r.steps[rank] for r in self.after(commit) if rank in r.steps
                     and not same_step(r.steps[rank], ck)), None)

    def same_step_after(self, commit: Row, rank: int, ck: Step) -> Row | None:
        """The first report of ``rank`` at step ``ck`` after ``commit`` in its attempt, before any later step."""
        for r in self.after(commit):
            if rank in r.steps:
                return r if same_step(r.steps[rank], ck) else None
        return None

    def strides_before(self, attempt: int) -> dict[int, Strides]:
        """Per rank: the positive step differences between consecutive reports of one
        attempt, from the attempts before ``attempt`` only — the attempt being judged does
        not vote for the stride it is judged by."""
        diffs: dict[int, collections.Counter[Any]] = collections.defaultdict(collections.Counter)
        last: dict[tuple[int, int], Any] = {}
        for r in self.stepped:
            if r.attempt >= attempt:
                continue
            for rank, step in r.steps.items():
                prev = last.get((r.attempt, rank))
                if prev is not None and step > prev and not same_step(step, prev):
                    diffs[rank][step_key(step - prev)] += 1
                last[(r.attempt, rank)] = step
        return {rank: Strides(tuple(d for d, _ in c.most_common())) for rank, c in diffs.items() if c}

    def recommitted(self, attempt: int, rank: int, commits: list[Row]) -> Step | None:
        """The first step at which ``attempt`` committed a checkpoint ``rank`` had already
        committed before it (work done twice), or None."""
        done = {c.steps[rank] for c in commits if rank in c.steps}
        return next((r.steps[rank] for r in self.of_attempt(attempt)
                     if r.checkpoint and rank in r.steps and step_in(r.steps[rank], done)), None)

    def uncommitted_before(self, attempt: int) -> list[ev.CheckpointPersisted]:
        """Checkpoints a rank persisted to storage in an attempt before ``attempt`` that Ray never
        committed (a fault came before every rank had reported them): Train V2 writes each
        rank's checkpoint folder first, so a script that scans storage can load one."""
        committed = {r.checkpoint for r in self.rows if r.checkpoint}
        return [p for p in self.persisted if p.attempt is not None and p.attempt < attempt
                and p.checkpoint not in committed and p.step is not None]

    def trained_after(self, attempt: int, rank: int, step: Step) -> Step | None:
        """The first step ``rank`` reported in ``attempt`` beyond ``step``."""
        return next((r.steps[rank] for r in self.stepped if r.attempt == attempt and rank in r.steps
                     and r.steps[rank] > step and not same_step(r.steps[rank], step)), None)

    def going_back(self) -> tuple[int, int, Step, Step] | None:
        """(attempt, rank, step, the smaller step after it): the first place where a rank's
        step metric went back within one attempt — a counter that resets (an epoch-local
        step) cannot tell a resume from a fresh start."""
        last: dict[tuple[int, int], Step] = {}
        for r in self.stepped:
            for rank, step in r.steps.items():
                prev = last.get((r.attempt, rank))
                if prev is not None and step < prev and not same_step(step, prev):
                    return r.attempt, rank, prev, step
                last[(r.attempt, rank)] = step
        return None

    def ranks_agreed_before(self, attempt: int) -> bool:
        return all(len(set(r.steps.values())) <= 1 for r in self.stepped if r.attempt < attempt)

    # -- state values ---------------------------------------------------------------------
    def value_at(self, rank: int, step: Step, attempts: Callable[[int], bool]) -> tuple[int, float] | None:
        """(attempt, state value) of the first report of ``rank`` at ``step`` with a value, in an
        attempt ``attempts`` accepts."""
        for r in self.stepped:
            value = r.value(rank)
            if value is not None and attempts(r.attempt) and same_step(r.steps.get(rank), step):
                return r.attempt, value
        return None

    def earlier_value(self, rank: int, step: Step, attempt: int) -> tuple[str, float] | None:
        """(where, value) that ``rank``'s ``step`` gave before ``attempt``: an earlier attempt's
        report, else the fault-free baseline's — at ``attempt``'s world size only (an elastic
        run's other sizes feed a rank other data and average its updates over other ranks)."""
        earlier = self.value_at(rank, step, lambda a: a < attempt and self.resized_between(a, attempt) is None)
        if earlier is not None:
            return f"attempt {earlier[0]}", earlier[1]
        first = self.attempts[0] if self.attempts else attempt
        value = self.baseline_values.get((rank, step_key(step)))
        if value is None or self.resized_between(first, attempt) is not None:
            return None
        return "the fault-free baseline", value

    def value_near(self, rank: int, step: Step, by: Step, attempt: int) -> tuple[Step, str, float] | None:
        """(the step, where, the value) an earlier report (before ``attempt``, else the fault-free
        baseline) gave ``by`` steps after ``step``, else ``by`` steps before it: what the state
        metric gives for a state that many updates away, which a value that decides between
        two such states must not reproduce."""
        for other in (step + by, step - by):
            found = self.earlier_value(rank, other, attempt)
            if found is not None:
                return other, found[0], found[1]
        return None

    def one_step(self, rank: int, attempt: int) -> Step | None:
        """One training step in the step metric's units: 1 where the rank's steps before
        ``attempt`` are whole numbers, else its regular reporting stride (an epoch fraction
        reported every step); None where neither is known."""
        steps = [r.steps[rank] for r in self.stepped if r.attempt < attempt and rank in r.steps]
        if all(isinstance(s, int) for s in steps):
            return 1
        strides = self.strides_before(attempt).get(rank)
        return strides.regular if strides is not None else None

    def first_valued(self, attempt: int, rank: int) -> tuple[Step, float] | None:
        """``rank``'s first report in ``attempt`` that carries a state value: (step, value)."""
        return next(((r.steps[rank], v) for r in self.stepped if r.attempt == attempt and rank in r.steps
                     and (v := r.value(rank)) is not None), None)

    def reproduces(self, value: float, earlier: float) -> bool:
        return same_state(value, earlier, self.rtol)

    def step_metric(self) -> str:
        """The step metric the run's reports were read with (the name found, else the names tried)."""
        used = next((r.data.step_metric for r in self.stepped if r.data.step_metric), None)
        if used:
            return used
        started = self.started
        return ", ".join((started.step_metric_names if started else None)
                         or [(started.step_metric if started else None) or "step"])


def _baseline_values(baseline: Baseline | None, metric: str | None) -> dict[tuple[int, Any], float]:
    """The fault-free run's state value per (rank, step key)."""
    if baseline is None or not metric:
        return {}
    return {(rank, step_key(step)): state[metric] for rank, rows in baseline.trajectory.items()
            for step, state in rows if finite(state.get(metric))}

"""The merged, time-ordered events of one run, and the metrics derived from them.

Every source (recorder, faults, cluster watcher, CUDA shim) appends `Event`s to one
`Timeline`.  Waits in the harness are waits on this timeline: a condition variable is
notified on every append, so a trigger fires on the event itself, never on a sleep.

Event kinds (``source`` / ``kind`` / notable ``data`` keys; chaos.verdicts.events has them as an
enum, with typed payloads for the ones the verdicts read):

(every recorder event also carries run_id: the Train run, one per fit())
recorder  controller_started   run_name, storage_path, failure_config{max_failures,...},
                               step_metric, step_metric_names, state_metric, num_workers,
                               elastic{min_workers, max_workers, resize_interval_s} or None
recorder  state_changed        prev, cur (TrainControllerState names)
recorder  resize_decision      attempt (the one before it), num_workers, cause (Train sized the
                               next worker group: start | restart | resize)
recorder  attempt_started      attempt, placement[{rank, node_id, pid, node_ip}], world_size,
                               cause (start | restart: after a failure decision | resize: an
                               elastic resize of a healthy group, no failure decision)
recorder  report               attempt, steps{rank: step (None: not reported)}, step_sources{rank:
                               metric|None}, step (rank 0's), states{rank: value} or None,
                               checkpoint (path or None), metrics (rank 0's scalars); where some rank
                               has one: checkpoint_after_step{rank: step} (a checkpoint reported
                               without a step, after that one), step_refused, state_refused,
                               state_nonfinite, without_ranks (chaos.train.recording)
recorder  failure_decision     attempt, decision (RETRY|RAISE), budget_class
                               (worker_group|preemption|controller), count, limit, error
recorder  run_finished         state (FINISHED|ERRORED|ABORTED), error
fault     fault_injected       fault, target{node_id, node_ip, host}, ledger_id, ...
                               (t: when the injection was issued)
fault     fault_returned       ledger_id (t: when the injection command returned)
fault     fault_detected       ledger_id, by (t: the detecting event's own time)
fault     fault_reverted       fault, ledger_id
                               (a correlated fault's members: each its own events, all
                               with the same ``group`` id: one fault, see fault_groups)
cluster   node_dead            node_id, node_ip, death_reason
cluster   node_alive           node_id, node_ip
cluster   head_unreachable     error (the node table could not be read: the head is gone)
cluster   head_reachable       (the node table answers again)
fault     head_loss            what a head fault did: outcome, diagnosis, gcs_ft, ... (chaos.faults.head)
harness   job_submitted        job_id, entrypoint; resubmits (the job whose driver was lost)
harness   job_abandoned        job_id, why (its driver was lost: the run goes on in a resubmission)
harness   events_unread        job_id, run_id, next_attempt, why (the abandoned job's events log
                               could not be read to its end: what it committed last is unknown)
harness   events_lost          job_id, run_id, seqs [first, last], before_t, why (events the recorder
                               numbered and could not write; before_t: the first event read after them)
harness   clock_offset         offset_s (head clock - harness clock), rtt_s
harness   job_finished         status, message
shim      cuda_injection       symbol, error, mode, rank, pid, call

Times are on the harness's clock: events stamped on the head (recorder, GCS node
states) are corrected by the measured clock offset as they arrive (`from_head`).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import threading
import time
from typing import Any, Callable, Iterable

from chaos.errors import Aborted, WaitTimeout


@dataclasses.dataclass(frozen=True)
class Event:
    t: float  # unix seconds, taken where the event was seen
    source: str
    kind: str
    data: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def attempt(self) -> int | None:
        return self.data.get("attempt")

    def to_json(self) -> dict[str, Any]:
        return {"t": self.t, "source": self.source, "kind": self.kind, "data": self.data}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Event":
        return cls(t=float(d["t"]), source=d["source"], kind=d["kind"], data=dict(d.get("data", {})))

    def describe(self) -> str:
        keys = ("attempt", "step", "checkpoint", "node_id", "decision", "budget_class", "count", "limit",
                "state", "status", "prev", "cur", "fault")
        parts = [f"{k}={self.data[k]}" for k in keys if self.data.get(k) is not None]
        return f"{self.source}.{self.kind}({', '.join(parts)})"


class Timeline:
    """Thread-safe, append-only event list with event-driven waits."""

    def __init__(self, events: Iterable[Event] = ()):
        self._events: list[Event] = sorted(events, key=lambda e: e.t)
        self._cond = threading.Condition()
        self._aborted: str | None = None
        self._abort_exc: type[Exception] = Aborted
        self.guard: Callable[[list[Event]], None] | None = None  # may raise to stop every wait
        self.clock_offset = 0.0  # head clock - harness clock, measured at the run's start
        self.clock_uncertainty = 0.5  # seconds either way when comparing head and harness times

    def set_clock_offset(self, offset_s: float, rtt_s: float) -> None:
        """Record the head's clock offset; head-stamped events are corrected from now on."""
        self.clock_offset = offset_s
        self.clock_uncertainty = max(0.05, rtt_s)
        self.emit("harness", "clock_offset", offset_s=offset_s, rtt_s=rtt_s)

    def from_head(self, t: float) -> float:
        """A head-clock time on the harness's clock."""
        return t - self.clock_offset

    def abort(self, reason: str, exc: type[Exception] = Aborted) -> None:
        """Make every current and future wait raise ``exc`` — Aborted for a stop condition,
        another ChaosError when the harness lost something it needs."""
        with self._cond:
            self._aborted, self._abort_exc = reason, exc
            self._cond.notify_all()

    # -- writing -----------------------------------------------------------------
    def add(self, event: Event) -> None:
        with self._cond:
            self._events.append(event)
            self._events.sort(key=lambda e: e.t)
            self._cond.notify_all()

    def emit(self, source: str, kind: str, t: float | None = None, **data: Any) -> Event:
        event = Event(t=time.time() if t is None else t, source=source, kind=kind, data=data)
        self.add(event)
        return event

    # -- reading -----------------------------------------------------------------
    @property
    def events(self) -> list[Event]:
        with self._cond:
            return list(self._events)

    def of(self, kind: str, source: str | None = None) -> list[Event]:
        return [e for e in self.events if e.kind == kind and (source is None or e.source == source)]

    def first(self, kind: str, after: float = float("-inf"), where: Callable[[Event], bool] | None = None):
        for e in self.events:
            if e.kind == kind and e.t >= after and (where is None or where(e)):
                return e
        return None

    def wait_for(
        self,
        predicate: Callable[[list[Event]], Any],
        timeout: float,
        what: str,
        abort: Callable[[list[Event]], str | None] | None = None,
    ) -> Any:
        """Block until ``predicate(events)`` is truthy; return its value.

        ``abort(events)`` may return a reason to stop waiting early (e.g. the run
        already finished).  On timeout or abort, raise WaitTimeout naming what was
        awaited and the last events seen.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self._aborted:
                    raise self._abort_exc(f"stopped waiting for {what}: {self._aborted}")
                events = list(self._events)
                value = predicate(events)
                if value:
                    return value
                if self.guard is not None:
                    self.guard(events)
                reason = abort(events) if abort else None
                if reason:
                    raise WaitTimeout(f"stopped waiting for {what}: {reason}; last events: {_tail(events)}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}; last events: {_tail(events)}")
                self._cond.wait(min(remaining, 1.0))

    # -- persistence -------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"events": [e.to_json() for e in self.events]}

    def dump(self, path) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1, default=str)

    @classmethod
    def load(cls, path) -> "Timeline":
        with open(path) as f:
            return cls(Event.from_json(d) for d in json.load(f)["events"])

    # -- derived views -----------------------------------------------------------
    def attempts(self) -> list[Event]:
        return self.of("attempt_started")

    def reports(self, attempt: int | None = None) -> list[Event]:
        return [e for e in self.of("report") if attempt is None or e.attempt == attempt]



def steps_of(report: Event) -> dict[int, int | float]:
    """rank -> step of one report event (ranks without a step left out)."""
    steps = report.data.get("steps")
    if steps is None:  # a single-rank record
        step = report.data.get("step")
        return {} if step is None else {0: step}
    return {int(rank): step for rank, step in steps.items() if step is not None}


def latest_run(events: list[Event]) -> str | None:
    """The run_id of the latest Train run (``fit()``) whose controller started."""
    return next((e.data.get("run_id") for e in reversed(events) if e.kind == "controller_started"), None)


def runs(timeline: Timeline) -> list[tuple[str, list[Event]]]:
    """The recorder events of each Train run (one per ``fit()``), in the order the runs started."""
    grouped: dict[str, list[Event]] = {}
    for e in timeline.events:
        if e.source == "recorder":
            grouped.setdefault(e.data.get("run_id", ""), []).append(e)
    return list(grouped.items())


def _tail(events: list[Event], n: int = 5) -> str:
    return "; ".join(e.describe() for e in events[-n:]) or "none"


@dataclasses.dataclass
class RecoveryMetrics:
    """Per-fault recovery figures, all in seconds (None when not observed)."""

    fault_t: float
    time_to_detect: float | None
    time_to_restart: float | None
    time_to_recover: float | None
    steps_lost: int | None
    recovered_attempt: int | None = None
    after_run_end: bool = False
    inject_took: float | None = None  # issue -> the injection command returned
    members: int = 1  # targets hit at once (a correlated fault)


def run_at(timeline: Timeline, t: float) -> str | None:
    """The Train run a fault at ``t`` hit: the latest run whose controller started before it
    (the first run when every run started later)."""
    started = timeline.of("controller_started")
    before = [e for e in started if e.t <= t + timeline.clock_uncertainty]
    chosen = before[-1] if before else (started[0] if started else None)
    return chosen.data.get("run_id") if chosen else None


def faulted_runs(timeline: Timeline) -> list[str]:
    """The runs the injected faults hit, in the order they started; with no fault, the last
    run (each verdict judges the run the faults hit, not a warm-up before it or an
    evaluation after it)."""
    order = [e.data.get("run_id") for e in timeline.of("controller_started")]
    hit = {run_at(timeline, members[0].t) for members in fault_groups(timeline)} - {None}
    if not hit:
        return order[-1:]
    return [r for r in dict.fromkeys(order) if r in hit]


def fault_groups(timeline: Timeline) -> list[list[Event]]:
    """The ``fault_injected`` events of each fault, in injection order: a correlated fault's
    members (same ``group``) together, every other fault on its own."""
    groups: dict[object, list[Event]] = {}
    for i, e in enumerate(timeline.of("fault_injected")):
        groups.setdefault(e.data.get("group") or ("single", i), []).append(e)
    return list(groups.values())


def _last_of_members(timeline: Timeline, kind: str, members: list[Event]) -> Event | None:
    """The latest ``kind`` event over a fault's members (None unless every member has one).

    For ``fault_detected``: the fault's own detection, recorded by the experiment from the
    fault's predicate (never re-derived here)."""
    seen = []
    for m in members:
        e = timeline.first(kind, where=lambda e: e.data.get("ledger_id") == m.data.get("ledger_id"))
        if e is None:
            return None
        seen.append(e)
    return max(seen, key=lambda e: e.t)


def first_recovery(events: list[Event], run: str | None, since: float) -> tuple[Event, Event] | None:
    """(the attempt, its first report): the first attempt of ``run`` started at or after
    ``since`` that reported at all — a recovery (an attempt that failed while starting, e.g.
    waiting for a replacement node, is none).  What the experiment waits for after a fault
    and what recovery time measures."""
    mine = [e for e in events if e.data.get("run_id") == run]
    for a in (e for e in mine if e.kind == "attempt_started" and e.t >= since):
        first = next((r for r in mine if r.kind == "report" and r.t >= a.t and r.attempt == a.attempt), None)
        if first is not None:
            return a, first
    return None


def recovery_metrics(timeline: Timeline) -> list[RecoveryMetrics]:
    """For every injected fault: fault → detected → the attempt that recovered → its first report.

    A correlated fault is one fault: issued when its first member was, detected when its
    last member was, one recovery.  The attempt that recovered is the first one started
    after the fault that reported at all (an attempt that failed while starting, e.g.
    waiting for a replacement node, is not a recovery).
    """
    out = []
    for members in fault_groups(timeline):
        fault = members[0]
        run = run_at(timeline, fault.t)
        reports = [r for r in timeline.reports() if r.data.get("run_id") == run]
        attempts = [a for a in timeline.attempts() if a.data.get("run_id") == run]
        dead = _last_of_members(timeline, "fault_detected", members)
        returned = _last_of_members(timeline, "fault_returned", members)
        ended = timeline.first("run_finished", where=lambda e: e.data.get("run_id") == run)
        after_end = ended is not None and ended.t < fault.t - timeline.clock_uncertainty and not any(
            a.t > fault.t for a in attempts)
        restart, first_report = first_recovery(timeline.events, run, fault.t) or (None, None)
        steps_lost = None
        if first_report is not None and first_report.data.get("step") is not None:
            before = [r for r in reports if r.t <= fault.t and r.data.get("step") is not None]
            if before:
                steps_lost = max(0, max(r.data["step"] for r in before) - first_report.data["step"] + 1)
        out.append(
            RecoveryMetrics(
                fault_t=fault.t,
                time_to_detect=dead.t - fault.t if dead else None,
                time_to_restart=restart.t - fault.t if restart else None,
                time_to_recover=first_report.t - fault.t if first_report else None,
                steps_lost=steps_lost,
                recovered_attempt=restart.attempt if restart else None,
                after_run_end=after_end,
                inject_took=returned.t - fault.t if returned else None,
                members=len(members),
            )
        )
    return out


def ettr(timeline: Timeline) -> float | None:
    """Effective training time ratio: productive time / wall time.

    Productive time is the time between consecutive reports of one attempt whose
    step had not been reached before (re-done steps are not productive).
    """
    reports = [r for r in timeline.reports() if r.data.get("step") is not None]
    starts = timeline.attempts()
    end = timeline.first("run_finished")
    if not reports or not starts:
        return None
    wall = (end.t if end else reports[-1].t) - starts[0].t
    if wall <= 0:
        return None
    productive, best, prev = 0.0, None, None
    for r in reports:
        if prev is not None and prev.attempt == r.attempt and (best is None or r.data["step"] > best):
            productive += r.t - prev.t
        best = r.data["step"] if best is None else max(best, r.data["step"])
        prev = r
    return productive / wall


def median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None

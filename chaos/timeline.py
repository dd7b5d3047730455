"""The merged, time-ordered events of one run, and the metrics derived from them.

Every source (recorder, faults, cluster watcher, CUDA shim) appends `Event`s to one
`Timeline`.  Waits in the harness are waits on this timeline: a condition variable is
notified on every append, so a trigger fires on the event itself, never on a sleep.

Event kinds (``source`` / ``kind`` / notable ``data`` keys):

recorder  controller_started   run_name, storage_path, failure_config{max_failures,...}
recorder  state_changed        prev, cur (TrainControllerState names)
recorder  attempt_started      attempt, placement[{rank, node_id, pid, node_ip}]
recorder  report               attempt, step (None if the metric is missing),
                               checkpoint (path or None), metrics
recorder  failure_decision     attempt, decision (RETRY|RAISE), budget_class
                               (worker_group|preemption|controller), count, limit, error
recorder  run_finished         state (FINISHED|ERRORED|ABORTED), error
fault     fault_injected       fault, target{node_id, node_ip, host}, ledger_id, ...
fault     fault_reverted       fault, ledger_id
cluster   node_dead            node_id, node_ip, death_reason
cluster   node_alive           node_id, node_ip
harness   job_finished         status, message
shim      cuda_injection       symbol, error, mode, rank, pid, call
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
        self._listeners: list[Callable[[Event], None]] = []
        self._aborted: str | None = None
        self._abort_exc: type[Exception] = Aborted

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
            listeners = list(self._listeners)
        for listener in listeners:
            listener(event)

    def emit(self, source: str, kind: str, t: float | None = None, **data: Any) -> Event:
        event = Event(t=time.time() if t is None else t, source=source, kind=kind, data=data)
        self.add(event)
        return event

    def subscribe(self, listener: Callable[[Event], None]) -> None:
        with self._cond:
            self._listeners.append(listener)

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

    def committed_before(self, t: float) -> Event | None:
        """Latest report carrying a committed checkpoint seen before time ``t``."""
        latest = None
        for e in self.of("report"):
            if e.t <= t and e.data.get("checkpoint"):
                latest = e
        return latest


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


def recovery_metrics(timeline: Timeline) -> list[RecoveryMetrics]:
    """For every injected fault: fault → detected → next attempt → its first report.

    Detected means the target node marked DEAD, or — for faults that leave the node up
    (``detect_by == "train"``, e.g. a CUDA error) — Train seeing a worker fail.
    """
    out = []
    for fault in timeline.of("fault_injected"):
        node_id = (fault.data.get("target") or {}).get("node_id")
        if fault.data.get("detect_by") == "train":
            dead = timeline.first("worker_error", after=fault.t) or timeline.first("failure_decision", after=fault.t)
        else:
            dead = timeline.first("node_dead", after=fault.t,
                                  where=lambda e: node_id is None or e.data.get("node_id") == node_id)
        restart = timeline.first("attempt_started", after=fault.t)
        first_report = None
        if restart is not None:
            first_report = timeline.first("report", after=restart.t, where=lambda e: e.attempt == restart.attempt)
        steps_lost = None
        if first_report is not None and first_report.data.get("step") is not None:
            before = [r for r in timeline.reports() if r.t <= fault.t and r.data.get("step") is not None]
            if before:
                steps_lost = max(0, max(r.data["step"] for r in before) - first_report.data["step"] + 1)
        out.append(
            RecoveryMetrics(
                fault_t=fault.t,
                time_to_detect=dead.t - fault.t if dead else None,
                time_to_restart=restart.t - fault.t if restart else None,
                time_to_recover=first_report.t - fault.t if first_report else None,
                steps_lost=steps_lost,
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

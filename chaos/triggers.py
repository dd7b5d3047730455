"""When a fault fires: on an event of the run, never after a bare sleep."""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import ClassVar

from chaos.errors import WaitTimeout
from chaos.timeline import Event, Timeline, latest_run


def run_ended(events: list[Event]) -> Event | None:
    """The event after which no trigger fired: the job's end, or the latest Train run's
    (``fit()``'s) end.  Only once a wait is over: while the job runs, a finished ``fit()``
    may be followed by the run under test (a warm-up first) — ``_job_ended`` is what stops
    a trigger's wait early."""
    latest = latest_run(events)
    return next((e for e in events if e.kind == "job_finished"
                 or (e.kind == "run_finished" and e.data.get("run_id") == latest)), None)


def _job_ended(events: list[Event]) -> str | None:
    """A trigger's wait stops early only on the job's end: when a run finishes, nothing yet
    says whether the driver's next line is another ``fit()``."""
    ended = next((e for e in events if e.kind == "job_finished"), None)
    return f"the run already ended ({run_ended(events).describe()})" if ended else None


@dataclasses.dataclass(frozen=True)
class _KthCheckpoint:
    """Fire on the k-th checkpoint of one Train run (over all its attempts) seen in events of
    ``kind`` (told apart by ``_one``) — a warm-up ``fit()``'s checkpoints do not count toward
    the next run's."""

    k: int
    kind: ClassVar[str]
    awaited: ClassVar[str]

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"{type(self).__name__}(k={self.k}): k counts from 1")

    def wait(self, timeline: Timeline, timeout: float) -> Event:
        def ready(events):
            seen: dict[str, set] = collections.defaultdict(set)
            for e in events:
                if e.kind == self.kind and e.data.get("checkpoint"):
                    checkpoints = seen[e.data.get("run_id")]
                    checkpoints.add(self._one(e))
                    if len(checkpoints) == self.k:
                        return e
            return None

        return timeline.wait_for(ready, timeout, self.awaited.format(k=self.k), abort=_job_ended)


@dataclasses.dataclass(frozen=True)
class AfterCheckpoint(_KthCheckpoint):
    """Fire once the k-th checkpoint of the run is committed."""

    kind: ClassVar[str] = "report"
    awaited: ClassVar[str] = "checkpoint {k} to be committed"

    @staticmethod
    def _one(e: Event) -> object:
        return id(e)  # every commit counts (a script may reuse a checkpoint folder's name)

    def describe(self) -> str:
        return f"after checkpoint {self.k} is committed"


@dataclasses.dataclass(frozen=True)
class AfterPersisted(_KthCheckpoint):
    """Fire once a rank has written the k-th checkpoint of the run to storage (its report, with
    the checkpoint, reached the controller) — before Ray commits it, when it waits for another
    rank's report: a fault then leaves on storage a checkpoint Ray never committed."""

    kind: ClassVar[str] = "checkpoint_persisted"
    awaited: ClassVar[str] = "a rank to persist checkpoint {k}"

    @staticmethod
    def _one(e: Event) -> object:
        return e.data["checkpoint"]  # every rank with a shard persists the same folder

    def describe(self) -> str:
        return f"after a rank persisted checkpoint {self.k}"


@dataclasses.dataclass(frozen=True)
class AtStep:
    """Fire when step n is reported (in the given attempt, or in any).

    ``fresh``: count only reports of the attempt running when the wait starts, or a later
    one — after a restart, steps reported before the previous fault do not fire it."""

    n: int
    attempt: int | None = None
    fresh: bool = False

    def describe(self) -> str:
        return (f"at step {self.n}" + (f" of attempt {self.attempt}" if self.attempt is not None else "")
                + (" (after the previous recovery)" if self.fresh else ""))

    def wait(self, timeline: Timeline, timeout: float) -> Event:
        since = _current_attempt(timeline.events) if self.fresh else None

        def ready(events):
            return next((e for e in _reports(events, since) if (e.data.get("step") or -1) >= self.n
                         and (self.attempt is None or e.attempt == self.attempt)), None)

        return timeline.wait_for(ready, timeout, f"step {self.n} to be reported", abort=_job_ended)


# -- campaign triggers (chaos.campaign): each counts only the attempt running when its wait
# starts, or a later one, so a schedule's faults follow one another through restarts.
def _current_attempt(events: list[Event]) -> int | None:
    """The newest attempt the recorder has announced or reported from (None: none yet)."""
    attempts = [e.attempt for e in events if e.kind in ("attempt_started", "report") and e.attempt is not None]
    return max(attempts) if attempts else None


def _reports(events: list[Event], since: int | None) -> list[Event]:
    return [e for e in events if e.kind == "report" and (since is None or (e.attempt is not None and e.attempt >= since))]


def _hold(timeline: Timeline, seconds: float, what: str, early=None) -> Event | None:
    """Let ``seconds`` pass while watching the run (not a bare sleep: the run ending, an
    abort or a stall stops it like any wait).  Returns what ``early(events)`` finds if that
    comes first, else None once the time is up."""
    try:
        return timeline.wait_for(early or (lambda events: None), seconds, what, abort=_job_ended)
    except WaitTimeout:
        if _job_ended(timeline.events):
            raise
        return None


def _elapsed(anchor: Event, what: str) -> Event:
    """The (unrecorded) event a timed trigger fires on: when its delay ran out."""
    return Event(time.time(), "harness", "trigger_delay_elapsed", {"step": anchor.data.get("step"), "after": what})


PHASES = ("before", "during", "after")


@dataclasses.dataclass(frozen=True)
class CheckpointPhase:
    """Fire around the commit of step ``step``'s checkpoint, from the recorder's reports:

    - ``before``: on the report of step ``step - 1`` (the commit step has begun, its
      checkpoint is not written yet);
    - ``during``: ``offset_s`` after that report, while the commit step runs (the reference
      workload writes its checkpoint after ``step_time``) — or at once on the commit's report
      if that comes first (the event it fires on says which);
    - ``after``: on the report that commits the checkpoint (step >= ``step`` with a checkpoint).

    Only reports of the attempt running when the wait starts, or a later one, count."""

    step: int
    phase: str
    offset_s: float = 0.0

    def __post_init__(self):
        if self.phase not in PHASES:
            raise ValueError(f"checkpoint phase {self.phase!r} unknown; expected one of {PHASES}")
        if self.step < 2 and self.phase != "after":
            raise ValueError(f"CheckpointPhase(step={self.step}, {self.phase!r}): the step before the commit "
                             "must exist, so step >= 2")
        if (self.phase == "during") != (self.offset_s > 0):
            raise ValueError(f"CheckpointPhase({self.phase!r}, offset_s={self.offset_s}): offset_s > 0 is "
                             "needed for 'during' and only for it")

    def describe(self) -> str:
        if self.phase == "before":
            return f"just before the checkpoint of step {self.step} is committed (on step {self.step - 1}'s report)"
        if self.phase == "during":
            return (f"during the commit of step {self.step}'s checkpoint ({self.offset_s:g} s after step "
                    f"{self.step - 1}'s report)")
        return f"just after the checkpoint of step {self.step} is committed"

    def wait(self, timeline: Timeline, timeout: float) -> Event:
        since = _current_attempt(timeline.events)

        def committed(events):
            return next((e for e in _reports(events, since)
                         if e.data.get("checkpoint") and (e.data.get("step") or -1) >= self.step), None)

        if self.phase == "after":
            return timeline.wait_for(committed, timeout, f"the checkpoint of step {self.step} to be committed",
                                     abort=_job_ended)
        before = timeline.wait_for(
            lambda events: next((e for e in _reports(events, since) if (e.data.get("step") or -1) >= self.step - 1),
                                None),
            timeout, f"step {self.step - 1} to be reported", abort=_job_ended)
        if self.phase == "before":
            return before
        what = f"{self.offset_s:g} s into the commit step {self.step}"
        return _hold(timeline, self.offset_s, what, early=committed) or _elapsed(before, what)


@dataclasses.dataclass(frozen=True)
class AfterRecovery:
    """Fire ``delay_s`` after the first report of the attempt running when the wait starts:
    the previous fault's recovery, or training's start for a run's first fault."""

    delay_s: float

    def __post_init__(self):
        if self.delay_s < 0:
            raise ValueError(f"AfterRecovery(delay_s={self.delay_s}): a delay cannot be negative")

    def describe(self) -> str:
        return f"{self.delay_s:g} s after the previous recovery (the running attempt's first report, or the start)"

    def wait(self, timeline: Timeline, timeout: float) -> Event:
        since = _current_attempt(timeline.events)
        first = timeline.wait_for(lambda events: next(iter(_reports(events, since)), None), timeout,
                                  "the running attempt's first report", abort=_job_ended)
        what = f"{self.delay_s:g} s after attempt {first.attempt}'s first report"
        _hold(timeline, first.t + self.delay_s - time.time(), what)
        return _elapsed(first, what)


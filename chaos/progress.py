"""Is the run still making progress?  A stalled or stuck run is a finding, not a harness error.

While training should be running, the experiment installs a `StallWatch` as the
timeline's guard: every wait then stops with a `Finding` as soon as no rank has reported
for longer than the stall limit (RUNNING), or the run has been restarting/scheduling
for longer than the recovery limit without a new attempt reporting.  The limit is learnt
from the run's own cadence (a Trainer that saves every few minutes is slow, not stalled),
with a floor, unless the user sets it.
"""

from __future__ import annotations

import time

from chaos.errors import VerificationError
from chaos.timeline import Event, latest_run
from chaos.verdicts import Verdict
from chaos.verdicts.progress import crash_loop, did_not_resume, stalled

STALL_FLOOR_S = 60.0
STALL_FACTOR = 3.0  # times the longest silence the run has shown so far
CRASH_LOOP_FAILURES = 3  # failures in a row without progress, under an unlimited budget
RECOVERING_STATES = {"SCHEDULING", "RESCHEDULING", "RESTARTING", "RESIZING", "PREEMPTING"}


class Finding(VerificationError):
    """A verdict reached while waiting (training stalled, did not resume): the waits stop,
    the run is stopped and judged on what it did."""

    def __init__(self, verdict: Verdict):
        super().__init__(verdict.message, [verdict])
        self.verdict = verdict


def silences(events: list[Event]) -> tuple[list[float], list[float]]:
    """The latest run's silences so far: (seconds from an attempt's start — its controller
    entering RUNNING — to its first report, seconds between consecutive reports of one
    attempt)."""
    latest = latest_run(events)
    firsts, gaps = [], []
    started: float | None = None
    last: float | None = None
    state = None
    for e in events:
        if e.data.get("run_id", latest) != latest or e.kind not in ("state_changed", "report"):
            continue
        if e.kind == "state_changed":
            if e.data.get("cur") == "RUNNING" and state != "RUNNING":
                started, last = e.t, None
            state = e.data.get("cur")
        elif last is not None:
            gaps.append(e.t - last)
            last = e.t
        else:
            if started is not None:
                firsts.append(e.t - started)
            last = e.t
    return firsts, gaps


class StallWatch:
    """The timeline guard: raises a Finding when the run stops making progress.

    The stall limit (unless fixed): max(floor, 3 × the longest silence the run has shown so
    far) once the running attempt has reported; before its first report, 3 × the longest
    time an earlier attempt of the run took from its start to its first report, plus the
    recovery SLO for a restarted attempt — and for the run's very first report, which
    nothing predicts, ``first_report_s``."""

    def __init__(self, limit_s: float | None = None, recover_limit_s: float = 300.0, floor_s: float = STALL_FLOOR_S,
                 slo_recover_s: float | None = None, first_report_s: float | None = None,
                 crash_loop_failures: int = CRASH_LOOP_FAILURES):
        self.fixed = limit_s
        self.crash_loop = crash_loop_failures
        self.floor = floor_s
        self.recover_limit = recover_limit_s
        self.slo_recover = slo_recover_s or 0.0
        self.first_report = first_report_s if first_report_s is not None else recover_limit_s
        self.waiting_for = "the run to make progress"

    def limit(self, events: list[Event]) -> float:
        if self.fixed is not None:
            return self.fixed
        firsts, gaps = silences(events)
        _, since = _controller_state(events)
        reported = any(e.kind == "report" and e.t >= since for e in events)
        if reported:
            return max(self.floor, STALL_FACTOR * max(firsts + gaps))
        if not firsts:
            return max(self.floor, self.first_report)
        return max(self.floor, STALL_FACTOR * max(firsts) + self.slo_recover)

    def __call__(self, events: list[Event]) -> None:
        loop = crash_loop(events, self.crash_loop)
        if loop is not None:
            raise Finding(loop)
        state, since = _controller_state(events)
        now = time.time()
        if state == "RUNNING":
            last = max([since] + [e.t for e in events if e.kind == "report"])
            limit = self.limit(events)
            if now - last > limit:
                raise Finding(stalled(events, now - last, limit, self.waiting_for))
        elif state in RECOVERING_STATES and now - since > self.recover_limit:
            raise Finding(did_not_resume(f"the run has been {state} for {now - since:.0f} s without a new attempt "
                                         "reporting", f"recovery limit {self.recover_limit:.0f} s, while waiting for "
                                         f"{self.waiting_for}"))


def _controller_state(events: list[Event]) -> tuple[str | None, float]:
    """The latest run's controller state and when it was entered (a repeated state is not
    a new entry)."""
    state, since = None, 0.0
    for e in reversed([e for e in events if e.kind == "state_changed"]):
        if state is None:
            state, since = e.data.get("cur"), e.t
        elif e.data.get("cur") == state:
            since = e.t
        else:
            break
    return state, since

"""Is the run still making progress?  A stalled or stuck run is a finding, not a harness error.

While training should be running, the experiment installs a `StallWatch` as the
timeline's guard: every wait then stops with a `Finding` as soon as no rank has reported
for longer than the stall limit (RUNNING), or the run has been restarting/scheduling
for longer than the recovery limit without a new attempt reporting.  The limit comes
from the run's own report interval, with a floor, unless the user sets it.
"""

from __future__ import annotations

import statistics
import time

from chaos.errors import VerificationError
from chaos.timeline import Event
from chaos.verify import Verdict, did_not_resume, stalled

STALL_FLOOR_S = 60.0
STALL_FACTOR = 10.0  # times the run's typical (90th percentile) report interval
RECOVERING_STATES = {"SCHEDULING", "RESCHEDULING", "RESTARTING", "RESIZING", "PREEMPTING"}


class Finding(VerificationError):
    """A verdict reached while waiting (training stalled, did not resume): the waits stop,
    the run is stopped and judged on what it did."""

    def __init__(self, verdict: Verdict):
        super().__init__(verdict.message, [verdict])
        self.verdict = verdict


def report_intervals(events: list[Event]) -> list[float]:
    """Seconds between consecutive reports of one attempt of one run."""
    last: dict[tuple, float] = {}
    out = []
    for e in events:
        if e.kind != "report":
            continue
        key = (e.data.get("run_id"), e.attempt)
        if key in last:
            out.append(e.t - last[key])
        last[key] = e.t
    return out


class StallWatch:
    """The timeline guard: raises a Finding when the run stops making progress."""

    def __init__(self, limit_s: float | None = None, recover_limit_s: float = 300.0, floor_s: float = STALL_FLOOR_S):
        self.fixed = limit_s
        self.floor = floor_s
        self.recover_limit = recover_limit_s
        self.waiting_for = "the run to make progress"

    def limit(self, events: list[Event]) -> float:
        if self.fixed is not None:
            return self.fixed
        gaps = sorted(report_intervals(events))
        if not gaps:
            return self.floor
        p90 = gaps[min(len(gaps) - 1, int(0.9 * len(gaps)))] if len(gaps) > 1 else statistics.median(gaps)
        return max(self.floor, STALL_FACTOR * p90)

    def __call__(self, events: list[Event]) -> None:
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

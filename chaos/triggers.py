"""When a fault fires: on an event of the run, never after a bare sleep."""

from __future__ import annotations

import dataclasses

from chaos.timeline import Event, Timeline


def _finished(events: list[Event]) -> str | None:
    for e in events:
        if e.kind in ("run_finished", "job_finished"):
            return f"the run already ended ({e.describe()})"
    return None


@dataclasses.dataclass(frozen=True)
class AfterCheckpoint:
    """Fire once the k-th checkpoint of the run (counted over all attempts) is committed."""

    k: int

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"AfterCheckpoint(k={self.k}): k counts from 1")

    def describe(self) -> str:
        return f"after checkpoint {self.k} is committed"

    def wait(self, timeline: Timeline, timeout: float) -> Event:
        def ready(events):
            commits = [e for e in events if e.kind == "report" and e.data.get("checkpoint")]
            return commits[self.k - 1] if len(commits) >= self.k else None

        return timeline.wait_for(ready, timeout, f"checkpoint {self.k} to be committed", abort=_finished)


@dataclasses.dataclass(frozen=True)
class AtStep:
    """Fire when step n is reported (in the given attempt, or in any)."""

    n: int
    attempt: int | None = None

    def describe(self) -> str:
        return f"at step {self.n}" + (f" of attempt {self.attempt}" if self.attempt is not None else "")

    def wait(self, timeline: Timeline, timeout: float) -> Event:
        def ready(events):
            return next((e for e in events if e.kind == "report" and (e.data.get("step") or -1) >= self.n
                         and (self.attempt is None or e.attempt == self.attempt)), None)

        return timeline.wait_for(ready, timeout, f"step {self.n} to be reported", abort=_finished)


"""preemption-window: per preemption, when Ray was told, the deadline, when the node went,
and whether a checkpoint was committed inside that window — made because of the notice
(off the script's periodic cadence, persisted after the notice) where the suite requires one."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from chaos.timeline import Event, Timeline, steps_of
from chaos.verdicts.diagnosis import Diagnosis
from chaos.verdicts.expect import Expect
from chaos.verdicts.status import Status
from chaos.verdicts.tolerance import same_step
from chaos.verdicts.verdict import Verdict


class PreemptionWindow:
    name = "preemption-window"
    judges_a_stopped_run = False

    def applies(self, expect: Expect) -> bool:
        return True

    def check(self, timeline: Timeline, expect: Expect) -> list[Verdict]:
        return preemption_window(timeline, expect)


@dataclasses.dataclass
class _Window:
    """One preemption's window and the checkpoints committed in it."""

    name: str
    notice: Event
    commits: list[Event]
    steps: list[Any]  # committed inside the window
    before: list[Any]  # periodic checkpoints before the notice (none inside an earlier window)
    cadence: Any
    periodic: list[Any]  # inside the window, on the cadence
    persisted: dict[str, float | None]  # checkpoint -> when a rank first persisted it
    early: set[Any]  # steps persisted before the notice
    when: str
    inside: str
    evidence: dict[str, Any]

    def verdict(self, status: Status, message: str, diagnosis: Diagnosis | None = None) -> Verdict:
        return Verdict(self.name, status, message, diagnosis, self.evidence)


def _cadence(steps: list[Any]) -> Any:
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
    return k >= 1 and same_step(last + k * cadence, step)


def _window(timeline: Timeline, i: int, notice: Event, windows: list[tuple[float, float]]) -> _Window:
    d = notice.data
    gone = timeline.first("node_dead", after=notice.t, where=lambda e: e.data.get("node_id") == d["node_id"])
    end = gone.t if gone is not None else d["deadline"]
    commits = [r for r in timeline.of("report") if r.data.get("checkpoint") and notice.t <= r.t <= end]
    steps = sorted({s for r in commits for s in steps_of(r).values()})
    before = sorted({s for r in timeline.of("report") if r.data.get("checkpoint") and r.t < notice.t
                     and not any(a <= r.t <= b for a, b in windows) for s in steps_of(r).values()})
    windows.append((notice.t, end))
    cadence = _cadence(before)
    periodic = [s for s in steps if cadence is not None and _on_cadence(s, before[-1], cadence)]
    # When each committed checkpoint reached storage: a rank's report with it in a poll (the rank
    # persisted it); one persisted before the notice was not made because of it.  The notice is
    # the earliest a rank could have learnt of it (Train's watcher passes it on later).
    persisted = {r.data["checkpoint"]: min((p.t for p in timeline.of("checkpoint_persisted")
                                            if p.data.get("checkpoint") == r.data["checkpoint"]), default=None)
                 for r in commits}
    early = {s for r in commits for s in steps_of(r).values()
             if (at := persisted[r.data["checkpoint"]]) is not None and at < notice.t}
    at_s = [round(r.t - notice.t, 3) for r in commits]
    evidence = {"notice_t": notice.t, "deadline_t": d["deadline"], "window_s": d["window_s"], "via": d["via"],
                "node_gone_t": gone.t if gone else None, "node_gone_after_s": gone.t - notice.t if gone else None,
                "death_reason": gone.data.get("death_reason") if gone else None, "checkpoint_steps": steps,
                "checkpoints_at_s": at_s, "periodic_checkpoint_steps": before, "cadence": cadence,
                "on_cadence": periodic, "persisted_before_notice": sorted(early),
                "persisted_at_s": {str(k): (round(v - notice.t, 3) if v is not None else None)
                                   for k, v in persisted.items()}}
    when = (f"notice at +0 s ({d['via']}), deadline +{d['window_s']:.1f} s, node gone "
            + (f"+{gone.t - notice.t:.1f} s" if gone else "not seen"))
    offsets = ", +".join(f"{x:.1f}" for x in at_s)
    inside = (f"checkpoint committed inside the window at step {', '.join(map(str, steps))} (+{offsets} s)" if commits
              else "no checkpoint committed inside the window")
    return _Window(f"preemption-window (preemption {i})", notice, commits, steps, before, cadence, periodic, persisted,
                   early, when, inside, evidence)


def preemption_window(timeline: Timeline, expect: Expect | None = None) -> list[Verdict]:
    expect = expect or Expect()
    out: list[Verdict] = []
    windows: list[tuple[float, float]] = []  # the earlier windows: a checkpoint there was no periodic one
    for i, notice in enumerate(timeline.of("preemption_notice"), 1):
        out.append(_judge(_window(timeline, i, notice, windows), expect.checkpoint_in_window))
    return out


def _judge(w: _Window, want: bool | None) -> Verdict:
    explained = set(w.periodic) | w.early
    if want is None:
        return w.verdict(Status.NOT_APPLICABLE, f"{w.when}; {w.inside} (not required either way)")
    if want and w.commits and any(v is None for v in w.persisted.values()) and not explained >= set(w.steps):
        return w.verdict(Status.UNVERIFIABLE, f"unverifiable: no persist record: {w.inside}, but the recorder saw no "
                         "rank persist it, so nothing tells whether it was written before or after the notice "
                         f"({w.when})", Diagnosis.NO_PERSIST_RECORD)
    if want and w.commits and w.early and explained >= set(w.steps):
        first = min(w.early)
        r = next(r for r in w.commits if first in steps_of(r).values())
        at = w.persisted[r.data["checkpoint"]]
        assert at is not None
        return w.verdict(Status.FAIL, f"no just-in-time checkpoint: {w.inside}, but the checkpoint at step {first} "
                         f"was already on storage {w.notice.t - at:.1f} s before the notice (a rank persisted it then; "
                         "Ray committed it once every rank had reported), so the notice did not cause it "
                         f"({w.when})", Diagnosis.NO_JIT_CHECKPOINT)
    if want and w.commits and w.cadence is None:
        return w.verdict(Status.UNVERIFIABLE, f"unverifiable: no checkpoint cadence: {w.inside}, but no checkpoint "
                         "was committed before the notice, so nothing tells a periodic checkpoint from one made "
                         f"because of the notice ({w.when})", Diagnosis.NO_CADENCE)
    if want and w.commits and len(w.periodic) == len(w.steps):
        return w.verdict(Status.FAIL, f"no just-in-time checkpoint: {w.inside}, but step "
                         f"{', '.join(map(str, w.periodic))} falls on the script's periodic cadence (every "
                         f"{w.cadence} steps from {w.before[-1]}), which explains it without the notice ({w.when})",
                         Diagnosis.NO_JIT_CHECKPOINT)
    if bool(w.commits) == want:
        return w.verdict(Status.PASS, f"{w.when}; {w.inside}" + (
            f", off the periodic cadence (every {w.cadence} steps from {w.before[-1]})" if want else ""))
    diagnosis = Diagnosis.NO_JIT_CHECKPOINT if want else Diagnosis.CHECKPOINT_IN_WINDOW
    return w.verdict(Status.FAIL, f"{diagnosis.value}: {w.when}; {w.inside}", diagnosis)

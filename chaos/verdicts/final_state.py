"""final-state: the finished run ends where a fault-free run of the same workload and seed
ends (each rank's step and state at its last report): a restart that restored the step but
not the weights, optimizer, RNG or data order ends somewhere else.  An elastic run that
trained part of the way at another world size ends elsewhere too, rightly: unverifiable."""

from __future__ import annotations

from typing import Any

from chaos.timeline import Timeline
from chaos.verdicts.diagnosis import Diagnosis
from chaos.verdicts.expect import Expect
from chaos.verdicts.states import (
    STATE_DIGEST_METRICS,
    UPDATED_DIGESTS,
    Baseline,
    baseline_path,
    baseline_unusable,
    comparable,
    faulted_run_events,
    final_states,
    fmt,
    sums_reorder,
)
from chaos.verdicts.status import Status
from chaos.verdicts.tolerance import STATE_ATOL, STATE_RTOL, close
from chaos.verdicts.verdict import Verdict

NAME = "final-state"


class FinalState:
    name = NAME
    judges_a_stopped_run = True

    def applies(self, expect: Expect) -> bool:
        return expect.final_state

    def check(self, timeline: Timeline, expect: Expect) -> list[Verdict]:
        if expect.reference is None:  # asked for, never made: said, not left out
            return [Verdict(NAME, Status.UNVERIFIABLE, "unverifiable: no baseline: the suite asked to compare the "
                            "final state with a fault-free run's (final_state=True), but none was made",
                            Diagnosis.NO_BASELINE)]
        return [final_state_matches(timeline, expect.reference, expect.rtol)]


def _names(state: dict[str, Any]) -> str:
    return ", ".join(sorted(state)) or "no state value"


def _sorted_ranks(mine: dict[int, dict[str, Any]], baseline: Baseline, rtol: float,
                  restarted: bool) -> tuple[list[str], list[str], list[str], list[int]]:
    """(differ, compared, uncompared, stateless), rank by rank; a run that ``restarted`` at more
    than two ranks ends in the baseline's state within the tolerance, not bit for bit
    (states.UPDATED_DIGESTS)."""
    differ, compared, uncompared, stateless = [], [], [], []
    for rank in sorted(set(mine) | set(baseline.final)):
        got, want = mine.get(rank), baseline.final.get(rank)
        if got is None or want is None:
            differ.append(f"rank {rank} never reported in {'the faulted run' if got is None else 'the baseline'}")
            continue
        common = sorted(m for m in set(got["state"]) & set(want["state"]) if comparable(want["state"][m])
                        and not (restarted and m in UPDATED_DIGESTS))
        if got["step"] != want["step"]:
            differ.append(f"rank {rank} finished at step {got['step']}, the baseline at step {want['step']}")
            continue
        bad = [m for m in common if not close(got["state"][m], want["state"][m], rtol, STATE_ATOL)]
        if bad:
            differ.append(f"rank {rank} at step {got['step']}: " + ", ".join(
                f"{m} {fmt(got['state'][m])} but {fmt(want['state'][m])} in the baseline" for m in bad))
        elif common:
            values = ", ".join(f"{m} {fmt(got['state'][m])}" for m in common)
            compared.append(f"rank {rank} at step {got['step']} ({values})")
        elif got["state"] or want["state"]:  # a state on one side only: this rank's is not compared
            uncompared.append(f"rank {rank} at step {got['step']} reported {_names(got['state'])} in the faulted run "
                              f"but {_names(want['state'])} in the baseline")
        else:
            stateless.append(rank)
    return differ, compared, uncompared, stateless


def _resized(timeline: Timeline) -> str | None:
    """Why an elastic run's end cannot be the fault-free run's: an attempt trained at another size."""
    off = {a: why for a, (_, why) in baseline_path(timeline).items() if why}
    if not off:
        return None
    a = min(off)
    return (f"unverifiable: no baseline at this run's world sizes: attempt {a}: {off[a]}; an elastic run's state "
            "follows the number of ranks it trained with, so the fault-free run's final state is not its own")


def final_state_matches(timeline: Timeline, baseline: Baseline, rtol: float = STATE_RTOL) -> Verdict:
    fin = next((e for e in faulted_run_events(timeline) if e.kind == "run_finished"), None)
    ended = fin.data.get("state") if fin else None
    mine = final_states(timeline)
    evidence = {"final": mine, "baseline": baseline.to_json(), "rtol": rtol, "atol": STATE_ATOL}
    if ended != "FINISHED":
        how = f"it ended {ended}" if ended else "no final controller state was recorded"
        return Verdict(NAME, Status.UNVERIFIABLE, f"unverifiable: the run did not finish ({how}), so it has no final "
                       "state to compare with the fault-free baseline", Diagnosis.RUN_DID_NOT_FINISH_FOR_STATE,
                       evidence)
    if not any(v["state"] for v in mine.values()):
        return Verdict(NAME, Status.UNVERIFIABLE, "unverifiable: no state metric: the run's reports carry no state "
                       f"value (--chaos-state-metric, or a {' / '.join(STATE_DIGEST_METRICS)} metric), so its final "
                       "state cannot be compared", Diagnosis.NO_STATE_METRIC, evidence)
    unusable = baseline_unusable(timeline, baseline) or _resized(timeline)
    if unusable:
        return Verdict(NAME, Status.UNVERIFIABLE, unusable, Diagnosis.NO_BASELINE, evidence)
    started = [e for e in faulted_run_events(timeline) if e.kind == "attempt_started"]
    restarted = len(started) > 1 and any(sums_reorder(len(e.data.get("placement") or [])) for e in started)
    differ, compared, uncompared, stateless = _sorted_ranks(mine, baseline, rtol, restarted)
    origin = baseline.origin()
    if differ:
        return Verdict(NAME, Status.FAIL, "final state differs from the fault-free run's: " + "; ".join(differ)
                       + f" ({origin})", Diagnosis.FINAL_STATE_DIFFERS, evidence)
    if uncompared and compared:
        return Verdict(NAME, Status.UNVERIFIABLE, "unverifiable: no state metric in common for every rank: "
                       + "; ".join(uncompared) + f", so its final state cannot be compared ({origin})",
                       Diagnosis.NO_STATE_METRIC, evidence)
    if not compared:
        return Verdict(NAME, Status.UNVERIFIABLE, "unverifiable: no state metric: the run and its baseline report no "
                       "state metric in common", Diagnosis.NO_STATE_METRIC, evidence)
    alike = (f"; rank(s) {', '.join(map(str, stateless))} reported no state value in either run, their steps "
             "alike" if stateless else "")
    return Verdict(NAME, Status.PASS, "every rank ended in the fault-free run's state: " + "; ".join(compared) + alike
                   + f" ({origin})", None, evidence)

"""recovery-time: fault injected → Ray marks the node dead (time to detect) → the attempt
that recovers → its first report (time to recover), on one clock, against the SLOs."""

from __future__ import annotations

import dataclasses

from chaos.timeline import Event, RecoveryMetrics, Timeline, fault_groups, recovery_metrics, run_at
from chaos.verdicts.diagnosis import Diagnosis
from chaos.verdicts.expect import Expect
from chaos.verdicts.status import Status
from chaos.verdicts.verdict import Verdict

NAME = "recovery-time"


class RecoveryTime:
    name = NAME
    judges_a_stopped_run = False

    def applies(self, expect: Expect) -> bool:
        return True

    def check(self, timeline: Timeline, expect: Expect) -> list[Verdict]:
        return recovery_time(timeline, expect)


def seconds(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f} s"


def recovery_time(timeline: Timeline, expect: Expect | None = None) -> list[Verdict]:
    expect = expect or Expect()
    verdicts = []
    for i, (m, group) in enumerate(zip(recovery_metrics(timeline), fault_groups(timeline))):
        evidence = dataclasses.asdict(m) | {"slo_detect_s": expect.slo_detect_s, "slo_recover_s": expect.slo_recover_s,
                                            "clock_offset_s": timeline.clock_offset}
        name = f"{NAME} (fault {i + 1})"
        verdicts.append(_absorbed(timeline, name, m, group[0], evidence) or _one(name, m, expect, evidence))
    return verdicts


def _absorbed(timeline: Timeline, name: str, m: RecoveryMetrics, fault: Event,
              evidence: dict[str, object]) -> Verdict | None:
    """A storage fault whose window ended with no attempt failed left nothing to recover (the
    S3 client's and Ray's retries absorbed it): what it did to the checkpoints is the storage
    verdict's to say.  None for any other fault, or one that failed an attempt."""
    lid = fault.data.get("ledger_id")
    ended = timeline.first("fault_detected", where=lambda e: e.data.get("ledger_id") == lid)
    if ended is None or ended.data.get("by") != "storage_window_ended" or m.time_to_recover is not None:
        return None
    run = run_at(timeline, fault.t)
    if any(d.data.get("run_id") == run and d.t >= fault.t for d in timeline.of("failure_decision")):
        return None
    return Verdict(name, Status.PASS, f"nothing to recover: no attempt failed while the {fault.data.get('fault')} "
                   f"fault lasted (its window ended {seconds(m.time_to_detect)} after the injection)", None, evidence)


def _one(name: str, m: RecoveryMetrics, expect: Expect, evidence: dict[str, object]) -> Verdict:
    if m.after_run_end:
        return Verdict(name, Status.UNVERIFIABLE, "inconclusive: the fault landed after the run had already ended, so "
                       "there was nothing to recover", Diagnosis.INCONCLUSIVE, evidence)
    problems = []
    if expect.slo_detect_s is not None and m.time_to_detect is not None and m.time_to_detect > expect.slo_detect_s:
        problems.append(f"time to detect {seconds(m.time_to_detect)} > SLO {expect.slo_detect_s:.1f} s")
    if m.time_to_detect is None:
        problems.append("Ray never noticed the fault")
    if expect.budget_exhausted:
        if problems:
            return Verdict(name, Status.FAIL, "recovery too slow: " + "; ".join(problems), Diagnosis.RECOVERY_TOO_SLOW,
                           evidence)
        return Verdict(name, Status.PASS, f"detected in {seconds(m.time_to_detect)} (SLO "
                       f"{seconds(expect.slo_detect_s)}); no recovery expected (budget exhausted)", None, evidence)
    if m.time_to_recover is None:
        problems.append("training never resumed after the fault")
    elif expect.slo_recover_s is not None and m.time_to_recover > expect.slo_recover_s:
        problems.append(f"time to recover {seconds(m.time_to_recover)} > SLO {expect.slo_recover_s:.1f} s")
    summary = (f"detected in {seconds(m.time_to_detect)}, attempt {m.recovered_attempt} started after "
               f"{seconds(m.time_to_restart)}, its first report after {seconds(m.time_to_recover)}")
    if problems:
        return Verdict(name, Status.FAIL, "recovery too slow: " + "; ".join(problems) + f" ({summary})",
                       Diagnosis.RECOVERY_TOO_SLOW, evidence)
    return Verdict(name, Status.PASS, summary, None, evidence)

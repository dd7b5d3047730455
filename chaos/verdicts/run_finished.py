"""run-finished: the run the faults hit ends FINISHED and its job SUCCEEDED (ERRORED and
FAILED when exhaustion is expected); and what a finish phase that timed out means."""

from __future__ import annotations

from typing import Any

from chaos.timeline import Event, Timeline, faulted_runs
from chaos.verdicts import events
from chaos.verdicts.diagnosis import Diagnosis
from chaos.verdicts.expect import Expect
from chaos.verdicts.progress import last_steps
from chaos.verdicts.states import faulted_run_events
from chaos.verdicts.status import Status
from chaos.verdicts.verdict import Verdict

NAME = "run-finished"


class RunFinished:
    name = NAME
    judges_a_stopped_run = False

    def applies(self, expect: Expect) -> bool:
        return True

    def check(self, timeline: Timeline, expect: Expect) -> list[Verdict]:
        return [run_finished(timeline, expect)]


def run_finished(timeline: Timeline, expect: Expect | None = None) -> Verdict:
    expect = expect or Expect()
    ended = next((e for e in faulted_run_events(timeline) if e.kind == "run_finished"), None)
    fin = events.RunFinished.model_validate(ended.data) if ended is not None else None
    job_ended = timeline.first("job_finished")
    job = events.JobFinished.model_validate(job_ended.data) if job_ended is not None else None
    status = job.status if job else None
    evidence: dict[str, Any] = {"run_state": fin.state if fin else None, "job_status": status,
                                "error": (fin.error if fin else None) or (job.message if job else None)}
    if fin is None:
        return Verdict(NAME, Status.FAIL, "run did not finish: no final controller state was recorded "
                       f"(job status {status})", Diagnosis.RUN_DID_NOT_FINISH, evidence)
    failed = _other_runs_failed(timeline)
    if failed:
        evidence["other_runs"] = [f.model_dump() for f in failed]
        return Verdict(NAME, Status.FAIL, "run failed: " + "; ".join(
            f"Train run {f.run_id}, a fit() no fault hit, ended {f.state}" + (f": {f.error}" if f.error else "")
            for f in failed)
            + f" (the run the faults hit ended {fin.state}, its job {status})", Diagnosis.RUN_FAILED, evidence)
    state = fin.state
    if expect.budget_exhausted:
        return _exhausted(state, status, evidence)
    if state == "FINISHED" and status == "SUCCEEDED":
        return Verdict(NAME, Status.PASS, "the run finished (FINISHED) and its job SUCCEEDED", None, evidence)
    if state == "FINISHED":
        return Verdict(NAME, Status.FAIL, f"run failed: training FINISHED but the job ended {status}: "
                       f"{evidence['error']}", Diagnosis.RUN_FAILED, evidence)
    return Verdict(NAME, Status.FAIL, f"run failed: ended {state}: {evidence['error']}", Diagnosis.RUN_FAILED, evidence)


def _other_runs_failed(timeline: Timeline) -> list[events.RunFinished]:
    """The driver's other Train runs (a warm-up or a later fit() no fault hit) that ended
    otherwise than FINISHED: a driver that catches fit()'s error still ends SUCCEEDED."""
    hit = set(faulted_runs(timeline))
    ended = (events.RunFinished.model_validate(e.data) for e in timeline.of("run_finished"))
    return [f for f in ended if f.run_id not in hit and f.state != "FINISHED"]


def _exhausted(state: Any, status: Any, evidence: dict[str, Any]) -> Verdict:
    if state == "ERRORED" and status is None:
        return Verdict(NAME, Status.UNVERIFIABLE, "unverifiable: no job status: the run ended ERRORED, but its job's "
                       "final status was never read, so nothing shows the driver failed with it (a driver that "
                       "swallows the error ends SUCCEEDED)", Diagnosis.NO_JOB_STATUS, evidence)
    if state == "ERRORED" and status == "FAILED":
        return Verdict(NAME, Status.EXPECTED, "the run ended in a clean failure (ERRORED), as budget exhaustion should",
                       None, evidence)
    return Verdict(NAME, Status.FAIL, f"run did not fail cleanly: it ended {state} (job {status}), but budget "
                   "exhaustion should end it ERRORED", Diagnosis.RUN_DID_NOT_FAIL_CLEANLY, evidence)


def did_not_end(events: list[Event], waited_s: float, driver_exit_s: float, job_status: str | None) -> Verdict:
    """The finish phase's deadline passed: the run never ended within ``waited_s``, or its
    driver had not exited ``driver_exit_s`` after Train's run had."""
    fins = [e for e in events if e.kind == "run_finished"]
    evidence: dict[str, Any] = {"waited_s": waited_s, "job_status": job_status, "last_steps": last_steps(events)}
    if fins:
        evidence["waited_s"] = driver_exit_s
        return Verdict(NAME, Status.FAIL, f"driver did not exit: Train's run ended {fins[-1].data.get('state')}, but "
                       f"{driver_exit_s:.0f} s later its job was still {job_status or 'not ended'} (the script hangs "
                       "after fit() returned)", Diagnosis.DRIVER_DID_NOT_EXIT, evidence)
    steps = ", ".join(f"rank {r} at step {s}" for r, s in sorted(evidence["last_steps"].items())) or "no report"
    return Verdict(NAME, Status.FAIL, f"run did not finish within {waited_s:.0f} s after the last fault "
                   f"(job {job_status or 'not ended'}; last steps: {steps})", Diagnosis.RUN_DID_NOT_FINISH, evidence)

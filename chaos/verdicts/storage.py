"""storage: what each storage fault (chaos.faults.storage) did to the checkpoints it met, read
from the storage fault proxy's record of the run's S3 requests (chaos.storage.events):

* a checkpoint whose upload failed is never what a restart restores — the folder is named,
  with what the fault answered it;
* a restore that failed fails its attempt (Ray charges it: within-budget says to what), never
  trains on without its state;
* a window in which nothing failed was absorbed by the S3 client's and Ray's retries: the
  checkpoint it met committed late, and by how much;
* a window that met no checkpoint upload or restore tested nothing: unverifiable, as is a run
  whose requests nobody recorded (no fault proxy).

Whether the next attempt resumed from the latest committed checkpoint is resumed-from-latest's
to say; the charges, within-budget's.
"""

from __future__ import annotations

from typing import Any

from chaos.faults.catalog import KINDS
from chaos.storage.events import Transfer, restores, uploads, usual_upload_s
from chaos.timeline import Event, Timeline
from chaos.verdicts.diagnosis import Diagnosis
from chaos.verdicts.expect import Expect
from chaos.verdicts.status import Status
from chaos.verdicts.verdict import Verdict

NAME = "storage"
STORAGE_KINDS = tuple(k for k in KINDS if k.startswith("storage-"))


class StorageFaults:
    name = NAME
    judges_a_stopped_run = True

    def applies(self, expect: Expect) -> bool:
        return True

    def check(self, timeline: Timeline, expect: Expect) -> list[Verdict]:
        faults = [f for f in timeline.of("fault_injected") if f.data.get("fault") in STORAGE_KINDS]
        return [storage_fault(timeline, f, f"{NAME} (fault {i})") for i, f in enumerate(faults, 1)]


def window(timeline: Timeline, fault: Event) -> tuple[float, float]:
    """When the fault acted: from its injection (or the first request it met) to its window's
    end (the timeline's end when none was recorded: it may have lasted that long)."""
    lid = fault.data.get("ledger_id")
    ended = timeline.first("storage_window_ended", where=lambda e: e.data.get("ledger_id") == lid)
    if ended is None:
        return fault.t, timeline.events[-1].t
    return float(ended.data.get("started") or fault.t), ended.t


def _committed(timeline: Timeline) -> dict[str, Any]:
    """checkpoint folder -> the step it was committed at."""
    return {str(r.data["checkpoint"]).rstrip("/").rsplit("/", 1)[-1]: r.data.get("step")
            for r in timeline.reports() if r.data.get("checkpoint")}


def _attempt_at(timeline: Timeline, run: str | None, t: float) -> int | None:
    started = [a for a in timeline.attempts() if a.data.get("run_id") == run and a.t <= t]
    return started[-1].attempt if started else None


def _name(t: Transfer, committed: dict[str, Any]) -> str:
    step = committed.get(t.checkpoint)
    return f"checkpoint step {step} ({t.checkpoint})" if step is not None else f"checkpoint folder {t.checkpoint}"


def storage_fault(timeline: Timeline, fault: Event, name: str) -> Verdict:
    run = fault.data.get("run_id") or _run_of(timeline, fault)
    start, end = window(timeline, fault)
    if not any(e.data.get("run_id") == run for e in timeline.of("storage_request")):
        return Verdict(name, Status.UNVERIFIABLE, "unverifiable: no storage evidence: nothing recorded the run's S3 "
                       "requests (its storage needs storage.s3.fault_proxy, whose log the harness reads)",
                       Diagnosis.NO_STORAGE_EVIDENCE, {"window": [start, end]})
    ups, rs, committed = uploads(timeline, run), restores(timeline, run), _committed(timeline)
    met = [t for t in (*ups, *rs) if t.start <= end and t.end >= start]
    unseen = _s3_errors(timeline, run, start, end)
    evidence = {"fault": fault.data.get("fault"), "window": [start, end], "s3_errors": unseen,
                "uploads": [_json(u, committed) for u in ups], "restores": [_json(r, committed) for r in rs]}
    if not met and not unseen:
        return Verdict(name, Status.UNVERIFIABLE, f"unverifiable: the storage fault met no checkpoint transfer: no "
                       f"upload or restore ran in its {end - start:.1f} s window", Diagnosis.STORAGE_MET_NOTHING,
                       evidence)
    findings = _restored_failed_uploads(ups, rs, committed) + _failed_restores_ignored(timeline, run, rs, committed)
    if findings:
        diagnosis, message = findings[0]
        return Verdict(name, Status.FAIL, message + "".join(f"; {m}" for _, m in findings[1:]), diagnosis, evidence)
    message = _what_happened(timeline, run, fault, ups, rs, met, committed)
    if unseen:  # a transfer the endpoint never saw (a partition): the ranks' own words for it
        message += "; " + "; ".join(f"attempt {e['attempt']}'s rank {e['rank']} failed with an S3 error: {e['error']}"
                                    for e in unseen)
    return Verdict(name, Status.PASS, message, None, evidence)


def _s3_errors(timeline: Timeline, run: str | None, start: float, end: float) -> list[dict[str, Any]]:
    """The ranks' S3 errors (pyarrow's "AWS Error ...") while the fault acted, as the recorder
    saw them: a transfer that failed before it reached the endpoint leaves only these."""
    out = []
    for e in timeline.of("worker_error"):
        if e.data.get("run_id") == run and start <= e.t <= end + 30:
            out += [{"attempt": e.attempt, "rank": r, "error": str(m).splitlines()[0][:240]}
                    for r, m in sorted((e.data.get("errors") or {}).items()) if "aws error" in str(m).lower()]
    return out


def _run_of(timeline: Timeline, fault: Event) -> str | None:
    started = [e for e in timeline.of("controller_started") if e.t <= fault.t]
    return started[-1].data.get("run_id") if started else None


def _json(t: Transfer, committed: dict[str, Any]) -> dict[str, Any]:
    return {"checkpoint": t.checkpoint, "step": committed.get(t.checkpoint), "start": t.start, "end": t.end,
            "ok": t.ok, "requests": t.requests, "failed": t.failed, "faulted": t.faulted, "client": t.client}


def _restored_failed_uploads(ups: list[Transfer], rs: list[Transfer],
                             committed: dict[str, Any]) -> list[tuple[Diagnosis, str]]:
    """A restore (an object read) of a folder whose upload failed: Ray never committed it, so
    only a script that reads storage itself can have chosen it."""
    failed = {u.checkpoint: u for u in ups if not u.ok and u.checkpoint not in committed}
    return [(Diagnosis.RESTORED_FAILED_UPLOAD,
             f"{Diagnosis.RESTORED_FAILED_UPLOAD.value}: {r.client} read checkpoint folder {r.checkpoint}, whose "
             f"upload failed ({failed[r.checkpoint].failed} of its {failed[r.checkpoint].requests} requests answered "
             f"with an error, {failed[r.checkpoint].faulted} by the fault) and which Ray never committed — the script "
             "loads checkpoints from storage itself instead of ray.train.get_checkpoint()")
            for r in rs if r.checkpoint in failed]


def _failed_restores_ignored(timeline: Timeline, run: str | None, rs: list[Transfer],
                             committed: dict[str, Any]) -> list[tuple[Diagnosis, str]]:
    """A restore whose last read failed must fail its attempt: an attempt that reported after
    it trained without the state it could not read."""
    out = []
    for r in (r for r in rs if not r.ok):
        attempt = _attempt_at(timeline, run, r.start)
        later = [e for e in timeline.reports() if e.data.get("run_id") == run and e.attempt == attempt and e.t > r.end]
        if attempt is not None and later:
            out.append((Diagnosis.FAILED_RESTORE_IGNORED,
                        f"{Diagnosis.FAILED_RESTORE_IGNORED.value}: {r.client}'s restore of "
                        f"{_name(r, committed)} in attempt {attempt} failed ({r.faulted} of its reads answered by the "
                        f"fault), yet attempt {attempt} reported step {later[0].data.get('step')} after it: the "
                        "script caught the error and trained on without its state"))
    return out


def _what_happened(timeline: Timeline, run: str | None, fault: Event, ups: list[Transfer], rs: list[Transfer],
                   met: list[Transfer], committed: dict[str, Any]) -> str:
    """The pass, in words: what failed and was never restored, what failed its attempt, or
    what was absorbed and how late it committed."""
    parts = []
    for u in (u for u in met if u in ups and not u.ok):
        parts.append(f"the upload of {_name(u, committed)} failed ({u.faulted} of its {u.requests} requests answered "
                     "by the fault): never committed, and no attempt restored it")
    for r in (r for r in met if r in rs and not r.ok):
        parts.append(f"{r.client}'s restore of {_name(r, committed)} failed and so did its attempt "
                     f"{_attempt_at(timeline, run, r.start)}")
    failed = [d for d in timeline.of("failure_decision") if d.data.get("run_id") == run and d.t >= fault.t]
    if not parts and not failed:
        late = [u for u in met if u in ups and u.ok]
        for u in late:
            usual = usual_upload_s(ups, u)
            parts.append(f"the upload of {_name(u, committed)} met it ({u.faulted} of its {u.requests} requests "
                         f"answered or held by the fault) and committed {u.took - (usual or 0.0):.1f} s late (it took "
                         f"{u.took:.1f} s; the run's other uploads {'n/a' if usual is None else f'{usual:.2f} s'})")
        parts.insert(0, "absorbed by the S3 client's and Ray's retries: no attempt failed")
    return "; ".join(parts) or (f"met {len(met)} checkpoint transfer(s), each of which completed"
                                if met else "met no transfer the endpoint saw")

"""Events the recorder could not write (a full disk on its node's Ray logs directory): the
recorder's EventsLogWriter numbers each event even when its write fails, the harness's
EventLog names the numbers missing (``events_lost``), and no verdict passes on what was left.
Each rule with the buggy resume a lost event would have hidden and its twin; the events go
through the real writer and the real reader, as on a cluster."""

from __future__ import annotations

import errno
import json

import pytest

from chaos.errors import ClusterError
from chaos.timeline import Timeline
from chaos.train import recorder
from chaos.train.channel import CHUNK_LINES, chunk_name
from chaos.train.eventlog import EventLog
from chaos.train.recorder import EventsLogWriter
from chaos.verdicts import Diagnosis, Expect
from chaos.verdicts.resume import resumed_from_latest
from chaos.verdicts.budget import within_budget
from test_eventlog import FakeCluster
from timelines import Script

DET = Expect(deterministic=True)  # the old verdict functions' default

LOST = "unverifiable: events lost"


def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def through_the_log(script: Script, tmp_path, monkeypatch, lose=lambda e: False) -> Timeline:
    """The script's timeline as the harness builds it: its recorder events written by the
    recorder's writer (those ``lose`` picks on a full disk) and read back by the harness's
    EventLog, the other sources' events as they are."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    writer = EventsLogWriter(str(tmp_path))
    recorded = [e for e in script.events if e.source == "recorder"]
    for e in recorded:
        with monkeypatch.context() as m:
            if lose(e):
                m.setattr(recorder, "open", full_disk, raising=False)
            writer.append(e.to_json())
    files = {f"chaos/job-1/{p.name}": p.read_bytes() for p in tmp_path.iterdir()}
    tl = Timeline(e for e in script.events if e.source != "recorder")
    log = EventLog(FakeCluster(files), "job-1", tl, look_every_s=0.01).start()
    kept = len(recorded) - sum(map(lose, recorded))
    tl.wait_for(lambda ev: sum(e.source == "recorder" for e in ev) == kept or None, 10, "every event written")
    assert log.drain(timeout_s=5) is None
    return tl


def commit(step, attempt=0):
    return lambda e: e.kind == "report" and e.attempt == attempt and (e.data.get("checkpoint") or "").endswith(f"_{step}")


def report(step, attempt):
    return lambda e: e.kind == "report" and e.attempt == attempt and e.data.get("step") == step


def restart(restored: int, last=20) -> Script:
    """Attempt 0 to step 12 (checkpoints 5 and 10), a raylet kill, and attempt 1 from the
    step after ``restored``."""
    return (Script().start_attempt().steps(1, 12).fault().decision().start_attempt()
            .steps(restored + 1, last).finish())


def test_the_writer_numbers_every_event_and_spends_the_number_of_one_it_could_not_write(tmp_path, monkeypatch):
    writer = EventsLogWriter(str(tmp_path))
    for i in range(3):
        with monkeypatch.context() as m:
            if i == 1:
                m.setattr(recorder, "open", full_disk, raising=False)
            writer.append({"t": 1.0 + i, "source": "recorder", "kind": "report", "data": {"step": i}})
    lines = [json.loads(x) for x in (tmp_path / chunk_name(0)).read_text().splitlines()]
    assert [(x["seq"], x["data"]["step"]) for x in lines] == [(0, 0), (2, 2)]


def test_a_later_fit_continues_the_log_where_the_earlier_one_left_it(tmp_path):
    """A warm-up fit() and the faulted one: two controllers, two writers, one log — numbered on,
    each file filled to CHUNK_LINES lines, so the reader follows it to the end."""
    first = EventsLogWriter(str(tmp_path))
    for i in range(30):
        first.append({"t": float(i), "source": "recorder", "kind": "report", "data": {"step": i}})
    second = EventsLogWriter(str(tmp_path))
    for i in range(30, 30 + CHUNK_LINES):
        second.append({"t": float(i), "source": "recorder", "kind": "report", "data": {"step": i}})
    files = sorted(tmp_path.iterdir())
    assert [p.name for p in files] == [chunk_name(0), chunk_name(1)]
    assert len(files[0].read_text().splitlines()) == CHUNK_LINES
    seqs = [json.loads(x)["seq"] for p in files for x in p.read_text().splitlines()]
    assert seqs == list(range(30 + CHUNK_LINES))
    tl = Timeline()
    log = EventLog(FakeCluster({f"chaos/job-1/{p.name}": p.read_bytes() for p in files}), "job-1", tl,
                   look_every_s=0.01).start()
    tl.wait_for(lambda ev: len(ev) == 30 + CHUNK_LINES or None, 10, "every event of both fits")
    assert log.drain(timeout_s=5) is None and not tl.of("events_lost")


def test_a_number_the_reader_has_passed_again_is_an_unreadable_log_not_skipped(tmp_path):
    """Two recorders writing one log without knowing of each other: refused loudly."""
    tl = Timeline()
    lines = b"".join((json.dumps({"seq": s, "t": 1.0 + i, "source": "recorder", "kind": "report", "data": {}})
                      + "\n").encode() for i, s in enumerate((0, 1, 1)))
    log = EventLog(FakeCluster({f"chaos/job-1/{chunk_name(0)}": lines}), "job-1", tl, look_every_s=0.01).start()
    with pytest.raises(ClusterError, match=r"is event 1 where event 2 or later was due"):
        tl.wait_for(lambda ev: False, 10, "the log")
    log.drain(timeout_s=1)
    nameless = Timeline()
    EventLog(FakeCluster({f"chaos/job-1/{chunk_name(0)}": b'{"t": 1.0, "source": "recorder", "kind": "report"}\n'}),
             "job-1", nameless, look_every_s=0.01).start()
    with pytest.raises(ClusterError, match=r"is no event \(KeyError: 'seq'\)"):
        nameless.wait_for(lambda ev: False, 10, "the log")


def test_a_lost_commit_never_lets_a_restore_of_the_checkpoint_before_it_pass(tmp_path, monkeypatch):
    """Buggy: attempt 1 restores checkpoint 5 where 10 was the latest.  With the report that
    committed 10 lost, the latest seen is 5 and the resume at 6 looked right."""
    tl = through_the_log(restart(5), tmp_path, monkeypatch, lose=commit(10))
    [gap] = tl.of("events_lost")
    assert gap.data["seqs"][0] == gap.data["seqs"][1] and gap.data["job_id"] == "job-1"
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "unverifiable" and v.diagnosis == LOST, v.line()
    assert v.message.startswith(f"{LOST}: the recorder could not write events {gap.data['seqs'][0]}.."), v.line()
    assert "so a checkpoint committed after step 5 would be missing" in v.message, v.line()
    assert v.evidence["judged_on_what_was_read"]["status"] == "pass"  # what it would have said
    [twin] = resumed_from_latest(through_the_log(restart(5), tmp_path / "twin", monkeypatch), DET)
    assert twin.status == "fail" and twin.diagnosis == "resumed from an older checkpoint", twin.line()


def test_a_right_resume_after_a_lost_commit_is_unverifiable_not_a_resume_past_it(tmp_path, monkeypatch):
    [v] = resumed_from_latest(through_the_log(restart(10), tmp_path, monkeypatch, lose=commit(10)), DET)
    assert v.status == "unverifiable" and v.diagnosis == LOST, v.line()
    assert v.evidence["judged_on_what_was_read"]["message"].startswith("resumed past the checkpoint")
    [twin] = resumed_from_latest(through_the_log(restart(10), tmp_path / "twin", monkeypatch), DET)
    assert twin.status == "pass", twin.line()


def test_a_lost_first_report_never_hides_a_checkpoint_step_trained_again(tmp_path, monkeypatch):
    """Buggy: attempt 1 trains checkpoint step 10 again (first report 10).  With that report
    lost, its first report read is 11: right after checkpoint 10, it looked."""
    tl = through_the_log(restart(9), tmp_path, monkeypatch, lose=report(10, attempt=1))
    [v] = resumed_from_latest(tl, DET)
    assert v.status == "unverifiable" and v.diagnosis == LOST, v.line()
    assert "so attempt 1's first report would be missing" in v.message, v.line()
    assert v.evidence["judged_on_what_was_read"]["status"] == "pass"
    [twin] = resumed_from_latest(through_the_log(restart(9), tmp_path / "twin", monkeypatch), DET)
    assert twin.status == "fail" and twin.diagnosis == "resumed from an older checkpoint", twin.line()
    assert "steps 10..10 were trained again" in twin.message, twin.line()


def test_what_events_lost_cannot_undo_still_fails(tmp_path, monkeypatch):
    """A fresh start, or ranks that began one report round at different steps, stay failures
    whatever was lost; a resume past the seen checkpoint does not (the lost report may be
    where the attempt began)."""
    [v] = resumed_from_latest(through_the_log(restart(0), tmp_path, monkeypatch, lose=commit(10)), DET)
    assert v.status == "fail" and v.diagnosis == "restarted from scratch", v.line()
    disagree = (Script().start_attempt().steps(1, 12).fault().decision().start_attempt()
                .steps(11, 20, rank_step=lambda r, s: s - 1 if r == 1 else s).finish())
    [v] = resumed_from_latest(through_the_log(disagree, tmp_path / "a", monkeypatch, lose=report(12, attempt=0)), DET)
    assert v.status == "fail" and v.diagnosis == "ranks disagree", v.line()
    [v] = resumed_from_latest(through_the_log(disagree, tmp_path / "b", monkeypatch, lose=report(11, attempt=1)), DET)
    assert v.status == "unverifiable" and v.diagnosis == LOST, v.line()
    assert v.evidence["judged_on_what_was_read"]["message"].startswith("resumed past the checkpoint")


def test_twin_events_lost_where_they_cannot_matter_leave_the_verdict_as_it_was(tmp_path, monkeypatch):
    """Lost before a checkpoint read later (step 7, then commit 10), or after the restarted
    attempt's first report (its step 13): the resume is judged, and a wrong one fails."""
    for i, lose in enumerate((report(7, attempt=0), report(13, attempt=1))):
        tl = through_the_log(restart(10), tmp_path / f"right{i}", monkeypatch, lose=lose)
        assert tl.of("events_lost")
        [v] = resumed_from_latest(tl, DET)
        assert v.status == "pass", v.line()
        [wrong] = resumed_from_latest(through_the_log(restart(5), tmp_path / f"wrong{i}", monkeypatch, lose=lose), DET)
        assert wrong.status == "fail" and wrong.diagnosis == "resumed from an older checkpoint", wrong.line()


def test_a_lost_failure_decision_makes_the_charges_unverifiable(tmp_path, monkeypatch):
    expect = Expect(charged={"worker_group": 1}, slo_detect_s=30, slo_recover_s=120)
    tl = through_the_log(restart(10), tmp_path, monkeypatch, lose=lambda e: e.kind == "failure_decision")
    v = within_budget(tl, expect)
    assert v.status == "unverifiable" and v.diagnosis == LOST, v.line()
    assert "so a failure decision its controller made then would be missing" in v.message, v.line()
    twin = within_budget(through_the_log(restart(10), tmp_path / "twin", monkeypatch), expect)
    assert twin.status == "pass", twin.line()


def test_events_lost_is_a_diagnosis():
    assert Diagnosis(LOST) is Diagnosis.EVENTS_LOST


def test_an_exhaustion_or_its_absence_is_unverifiable_with_events_lost(tmp_path, monkeypatch):
    """An exhaustion suite: the RAISE lost reads as 'budget not exhausted' — a shortfall the
    lost events explain, so unverifiable, not a failure; an exhaustion read with a report lost
    before it is unverifiable too (an unrelated failure's decision may be what was lost).  A
    charge to the wrong class, read, stays a failure whatever was lost."""
    expect = Expect(charged={"worker_group": 1}, budget_exhausted=True)
    exhausted = Script(max_failures=0).start_attempt().steps(1, 6).fault().decision("RAISE", limit=0).finish("ERRORED")
    for i, lose in enumerate((lambda e: e.kind == "failure_decision", report(3, attempt=0))):
        v = within_budget(through_the_log(exhausted, tmp_path / str(i), monkeypatch, lose=lose), expect)
        assert v.status == "unverifiable" and v.diagnosis == LOST, v.line()
    twin = within_budget(through_the_log(exhausted, tmp_path / "twin", monkeypatch), expect)
    assert twin.status == "expected", twin.line()
    wrong = (Script().start_attempt().steps(1, 12).fault().decision(budget_class="preemption", limit=None)
             .start_attempt().steps(11, 20).finish())
    v = within_budget(through_the_log(wrong, tmp_path / "wrong", monkeypatch, lose=report(4, attempt=0)),
                      Expect(charged={"worker_group": 1}))
    assert v.status == "fail" and v.diagnosis == "charged to the wrong budget class", v.line()

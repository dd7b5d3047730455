"""Timeline waits, triggers and the ledger: the event plumbing every experiment stands on."""

import threading

import pytest
from timelines import Script

from chaos.errors import Aborted, WaitTimeout
from chaos.ledger import Ledger
from chaos.timeline import Event, Timeline, ettr, first_recovery, recovery_metrics
from chaos.triggers import AfterCheckpoint, AfterPersisted, AtStep


def test_wait_for_wakes_on_the_event_not_on_a_timer():
    tl = Timeline()
    threading.Timer(0.05, lambda: tl.emit("recorder", "report", step=3, checkpoint="c")).start()
    e = AfterCheckpoint(1).wait(tl, timeout=5)
    assert e.data["step"] == 3


def test_after_persisted_fires_on_a_ranks_kth_checkpoint_before_ray_commits_it():
    # checkpoints 5 and 10 persisted in the polls that committed them; the third folder, persisted
    # by rank 0 while Ray waits for another rank, fires it before any commit
    s = Script().start_attempt().steps(1, 10).persist("/storage/checkpoint_15", 15)
    tl = s.timeline()
    e = AfterPersisted(3).wait(tl, timeout=1)
    assert e.data["checkpoint"] == "/storage/checkpoint_15" and e.data["rank"] == 0
    with pytest.raises(WaitTimeout, match="a rank to persist checkpoint 4"):
        AfterPersisted(4).wait(tl, timeout=0.1)
    with pytest.raises(ValueError):
        AfterPersisted(0)


def test_wait_timeout_says_what_was_awaited_and_seen():
    tl = Timeline([Event(1.0, "recorder", "report", {"attempt": 0, "step": 1})])
    with pytest.raises(WaitTimeout, match=r"waiting for step 9 to be reported; last events: recorder.report\(attempt=0, step=1\)"):
        AtStep(9).wait(tl, timeout=0.1)


def test_trigger_stops_waiting_when_the_job_already_ended():
    tl = Timeline([Event(1.0, "recorder", "run_finished", {"state": "ERRORED"}),
                   Event(2.0, "harness", "job_finished", {"status": "FAILED"})])
    with pytest.raises(WaitTimeout, match=r"the run already ended \(recorder.run_finished"):
        AfterCheckpoint(2).wait(tl, timeout=60)


def test_a_warm_up_fit_that_ends_before_the_next_one_starts_does_not_stop_the_wait():
    """As it happens live: the warm-up's end is all the wait has seen (the driver's next
    fit() has not started its controller yet); the run under test's checkpoint 2 then fires it."""
    s = Script().start_attempt().steps(1, 3)
    s.events.append(s._e("recorder", "run_finished", state="FINISHED"))
    tl = s.timeline()
    looked = threading.Event()
    tl.guard = lambda events: looked.set()  # called on every look the wait takes
    got = {}

    def wait():
        try:
            got["event"] = AfterCheckpoint(2).wait(tl, timeout=60)
        except WaitTimeout as e:
            got["error"] = e

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert looked.wait(10), "the trigger's wait never looked at the timeline"
    seen = len(s.events)
    s.new_run("run2").start_attempt().steps(1, 10)
    for e in s.events[seen:]:
        tl.add(e)
    waiter.join(10)
    assert "error" not in got, got
    assert (got["event"].data["run_id"], got["event"].data["step"]) == ("run2", 10), got


def test_abort_interrupts_every_wait():
    tl = Timeline()
    threading.Timer(0.05, lambda: tl.abort("3 nodes dead for 61 s")).start()
    with pytest.raises(Aborted, match="3 nodes dead"):
        AtStep(1).wait(tl, timeout=5)


def test_checkpoints_count_from_1():
    with pytest.raises(ValueError, match="k counts from 1"):
        AfterCheckpoint(0)


def test_recovery_metrics_and_ettr():
    s = Script().start_attempt().steps(1, 12).fault(detect=1.5).decision().start_attempt().steps(11, 20).finish()
    [m] = recovery_metrics(s.timeline())
    assert m.time_to_detect == pytest.approx(1.5)
    assert m.steps_lost == 2  # steps 11 and 12 were done twice
    assert 0 < ettr(s.timeline()) < 1


def test_a_recovery_is_the_faulted_runs_own_attempt():
    """Another run's attempt 1 reporting after the fault (an evaluation run, a resubmission)
    is no recovery of the faulted run: what the experiment waits for and what recovery time
    measures are the same rule (first_recovery)."""
    s = Script().start_attempt().steps(1, 12).fault(detect=1.5).decision()
    s.events.append(s._e("recorder", "attempt_started", 1.0, run_id="other", attempt=1))
    s.events.append(s._e("recorder", "report", 2.0, run_id="other", attempt=1, step=1, steps={"0": 1}))
    fault_t = s.timeline().of("fault_injected")[-1].t
    assert first_recovery(s.timeline().events, "run1", fault_t) is None
    [m] = recovery_metrics(s.timeline())
    assert m.recovered_attempt is None and m.time_to_recover is None
    s.start_attempt().steps(11, 13)
    attempt, first = first_recovery(s.timeline().events, "run1", fault_t)
    assert (attempt.attempt, first.data["step"]) == (1, 11)
    assert recovery_metrics(s.timeline())[0].recovered_attempt == 1


def test_the_experiments_wait_and_recovery_time_take_the_same_recovery():
    """A warm-up fit, the faulted fit, an evaluation fit after it: the event the experiment's
    wait after the fault returns and the attempt recovery time measures are the faulted run's
    own (the evaluation fit's attempt reporting after the fault is neither's recovery)."""
    import types

    from chaos.experiment import Experiment

    def fits(recovers):
        s = Script().start_attempt().steps(1, 3).finish()  # the warm-up fit
        s.new_run().start_attempt().steps(1, 12).fault(detect=1.5).decision("RETRY" if recovers else "RAISE")
        if recovers:
            s.start_attempt().steps(11, 20)
        s.finish("FINISHED" if recovers else "ERRORED").new_run().start_attempt().steps(1, 3).finish()
        return s.timeline()

    def waited(tl):
        said = []
        stub = types.SimpleNamespace(timeline=tl, reporter=types.SimpleNamespace(say=said.append),
                                     env=types.SimpleNamespace(timeouts=types.SimpleNamespace(recover_s=0.01)))
        Experiment._recover(stub)
        [line] = said
        return next(e for e in tl.events if line == f"after the fault: {e.describe()}")

    tl = fits(recovers=True)
    [m] = recovery_metrics(tl)
    e = waited(tl)
    assert (e.kind, e.data["run_id"], e.attempt, e.data["step"]) == ("report", "run2", 1, 11)
    assert m.recovered_attempt == 1 and m.time_to_recover == pytest.approx(e.t - tl.of("fault_injected")[0].t)
    tl = fits(recovers=False)
    [m] = recovery_metrics(tl)
    e = waited(tl)
    assert (e.kind, e.data["run_id"]) == ("run_finished", "run2"), e
    assert m.recovered_attempt is None and m.time_to_recover is None


def test_detection_is_the_faults_own_detection_event_not_a_node_death():
    """The experiment records the event the fault's predicate matched (here Train seeing the
    rank fail); metrics read that, never a re-derived rule (e.g. a later node death)."""
    s = Script().start_attempt().steps(1, 12)
    s.events.append(s._e("fault", "fault_injected", fault="cuda", ledger_id="c1", target={"node_id": "n1"}))
    s.events.append(s._e("recorder", "worker_error", 0.8, attempt=0, errors={"1": "CUDA error"}))
    s.events.append(s._e("fault", "fault_detected", 0.0, ledger_id="c1", by="worker_error"))
    s.events.append(s._e("cluster", "node_dead", 3.0, node_id="n1"))
    [m] = recovery_metrics(s.decision().start_attempt().steps(11, 15).timeline())
    assert m.time_to_detect == pytest.approx(0.8)


def test_ledger_is_written_before_and_merged_after(tmp_path):
    ledger = Ledger(tmp_path / "l.jsonl")
    i = ledger.record("partition", {"node_ip": "198.18.0.2"}, {"action": "none"})
    assert [e["state"] for e in ledger.open_entries()] == ["pending"]
    ledger.mark(i, "injected")
    ledger.mark(i, "reverted")
    assert ledger.open_entries() == [] and ledger.entries()[i]["state"] == "reverted"
    assert len(ledger.lines()) == 3


def test_checkpoints_count_per_run_not_across_a_warm_up():
    s = Script().start_attempt().steps(1, 5)  # a warm-up fit() with one checkpoint (step 5)
    s.events.append(s._e("recorder", "run_finished", state="FINISHED"))
    s.new_run().start_attempt().steps(1, 10)  # the run under test: checkpoints at 5 and 10
    e = AfterCheckpoint(2).wait(s.timeline(), timeout=1)  # the warm-up's end does not stop the wait
    assert (e.data["run_id"], e.data["step"]) == ("run2", 10), e
